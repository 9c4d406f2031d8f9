// A tiny command-line flag parser for the samples and tools: --name=value, --name value,
// --bool-flag.
#pragma once

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "rpc/secret_file.h"

namespace rdmarpc::cmdline {

class Flags {
 public:
  // `known` maps each flag name to whether it takes a value. Unknown flags and missing values
  // are errors (see error()), and so are arguments that are not flags unless `positional` is
  // set (then they are kept, in order, in positional(); "--" ends the flags).
  Flags(int argc, char** argv, const std::map<std::string, bool>& known, bool positional = false) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h" && known.count("help")) {  // what everyone types first
        values_["help"].push_back("");
        continue;
      }
      if (positional && a == "--") {
        for (++i; i < argc; ++i) positional_.push_back(argv[i]);
        return;
      }
      if (a.rfind("--", 0) != 0) {
        if (positional) {
          positional_.push_back(a);
          continue;
        }
        error_ = "unexpected argument '" + a + "'";
        return;
      }
      std::string name = a.substr(2), value;
      bool has_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      auto it = known.find(name);
      if (it == known.end()) {
        error_ = "unknown flag --" + name;
        return;
      }
      if (it->second && !has_value) {
        if (i + 1 >= argc) {
          error_ = "flag --" + name + " needs a value";
          return;
        }
        value = argv[++i];
      }
      values_[name].push_back(value);
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
