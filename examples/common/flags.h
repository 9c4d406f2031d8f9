// A tiny command-line flag parser for the samples: --name=value, --name value, --bool-flag.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace rdmarpc::examples {

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
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      error_ = "cannot read --auth-secret-file " + path + ": " + std::strerror(errno);
      return "";
    }
    if (!S_ISREG(st.st_mode)) {
      error_ = "--auth-secret-file " + path + " is not a regular file";
      return "";
    }
    std::string secret;
    try {
      std::ifstream in(path, std::ios::binary);
      secret.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        error_ = "cannot read --auth-secret-file " + path;
        return "";
      }
    } catch (const std::exception& e) {
      error_ = "cannot read --auth-secret-file " + path + ": " + e.what();
      return "";
    }
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    if (secret.empty()) error_ = "--auth-secret-file " + path + " is empty";
    return secret;
  }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
  std::string error_;
};

// The one-line reason a log level was refused: the flag's value, or $RDMARPC_LOG_LEVEL's when
// the flag was not given, and the levels there are.
inline std::string LogLevelError(const std::string& flag_value) {
  const char* env = std::getenv("RDMARPC_LOG_LEVEL");
  const bool from_env = flag_value.empty() && env != nullptr;
  return "unknown log level '" + (from_env ? std::string(env) : flag_value) + "'" +
         (from_env ? " in $RDMARPC_LOG_LEVEL" : "") +
         " (valid: trace, debug, info, warn, error, off)";
}

}  // namespace rdmarpc::examples
