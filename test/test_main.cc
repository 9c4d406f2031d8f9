// The one translation unit with Catch2's main, shared by every test binary.
//
// A listener also writes one JUnit <testcase> per Catch2 test case to $XML_OUTPUT_FILE (set by
// `bazel test`), so that tools/test.sh can count test cases rather than test binaries.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

struct JunitListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;

  struct Case {
    std::string name;
    bool failed;
    double seconds;
  };

  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    cases_.push_back({stats.testInfo.name,
                      stats.totals.assertions.failed > 0 || stats.totals.testCases.failed > 0,
                      0.0});
  }

  void testRunEnded(const Catch::TestRunStats&) override {
    const char* path = std::getenv("XML_OUTPUT_FILE");
    if (!path || !*path) return;
    const char* target = std::getenv("TEST_TARGET");
    std::string suite = target ? target : "catch2";
    size_t failures = 0;
    for (auto& c : cases_) failures += c.failed;
    std::ofstream out(path);
    out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n"
        << "<testsuite name=\"" << XmlEscape(suite) << "\" tests=\"" << cases_.size()
        << "\" failures=\"" << failures << "\">\n";
    for (auto& c : cases_) {
      out << "  <testcase classname=\"" << XmlEscape(suite) << "\" name=\"" << XmlEscape(c.name)
          << "\">";
      if (c.failed) out << "<failure message=\"assertions failed; see test.log\"/>";
      out << "</testcase>\n";
    }
    out << "</testsuite>\n</testsuites>\n";
  }

  std::vector<Case> cases_;
};

}  // namespace

CATCH_REGISTER_LISTENER(JunitListener)
