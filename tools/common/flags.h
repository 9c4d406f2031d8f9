// The command-line flags of the samples and tools, parsed by Boost.Program_options (as the
// rdmarpc tool's are): --name=value, --name value, --bool-flag, -h for --help; "--" ends the
// flags. Options are never abbreviated (--thr is not --threads) and a flag may repeat (all()
// returns every value, get() the last).
#pragma once

#include <boost/program_options.hpp>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "rpc/secret_file.h"

namespace rdmarpc::cmdline {

class Flags {
 public:
  // `known` maps each flag name to whether it takes a value. Unknown flags and missing values
  // are errors (see error()), and so are arguments that are not flags unless `positional` is
  // set (then they are kept, in order, in positional()).
  Flags(int argc, char** argv, const std::map<std::string, bool>& known, bool positional = false) {
    namespace po = boost::program_options;
    po::options_description desc;
    for (const auto& [name, takes_value] : known) {
      const std::string spec = name == "help" ? "help,h" : name;
      if (takes_value) {
        desc.add_options()(spec.c_str(), po::value<std::string>());
      } else {
        desc.add_options()(spec.c_str(),
                           po::value<std::string>()->zero_tokens()->implicit_value(""));
      }
    }
    // Arguments that are not flags land here; refused below unless `positional`.
    constexpr const char* kRest = "\x01rest";
    desc.add_options()(kRest, po::value<std::vector<std::string>>());
    po::positional_options_description rest;
    rest.add(kRest, -1);
    namespace style = po::command_line_style;
    try {
      const po::parsed_options parsed =
          po::command_line_parser(argc, argv)
              .options(desc)
              .positional(rest)
              .style(style::allow_long | style::long_allow_adjacent | style::long_allow_next |
                     style::allow_short | style::allow_dash_for_short | style::short_allow_next)
              .run();
      for (const po::option& o : parsed.options) {
        if (o.string_key == kRest) {
          if (!positional) {
            error_ = "unexpected argument '" + (o.value.empty() ? "" : o.value[0]) + "'";
            return;
          }
          positional_.insert(positional_.end(), o.value.begin(), o.value.end());
          continue;
        }
        values_[o.string_key].push_back(o.value.empty() ? "" : o.value.back());
      }
    } catch (const po::unknown_option& e) {
      std::string name = e.get_option_name();  // "--name=value" as typed: name it alone
      error_ = "unknown flag " + name.substr(0, name.find('='));
    } catch (const po::invalid_command_line_syntax& e) {
      const std::string name = e.get_option_name();
      switch (e.kind()) {
        case po::invalid_syntax::missing_parameter:
          error_ = "flag " + name + " needs a value";
          break;
        case po::invalid_syntax::extra_parameter:
          error_ = "flag " + name + " takes no value";
          break;
        default:
          error_ = e.what();
      }
    } catch (const po::error& e) {
      error_ = e.what();
    }
  }

  const std::string& error() const { return error_; }
  const std::vector<std::string>& positional() const { return positional_; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second.back();
  }
  std::vector<std::string> all(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  // Parses an integer flag; sets error() if it is not a number in [min, max].
  long get_int(const std::string& name, long fallback, long min, long max) {
    if (!has(name)) return fallback;
    std::string v = get(name, "");
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < min || n > max) {
      error_ = "--" + name + " must be a number from " + std::to_string(min) + " to " +
               std::to_string(max) + ", got '" + v + "'";
      return fallback;
    }
    return n;
  }

  // The shared secret named by --auth-secret-file: the file's contents without a trailing
  // newline ("" when the flag is absent). Sets error() if the file cannot be read or is empty.
  // Secrets come from a file, never the command line, where `ps` would show them.
  std::string auth_secret() {
    if (!has("auth-secret-file")) return "";
    const std::string path = get("auth-secret-file", "");
    return ReadSecretFile(path, "--auth-secret-file " + path, &error_);
  }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
  std::string error_;
};

}  // namespace rdmarpc::cmdline
