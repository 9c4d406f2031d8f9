#include "rpc/secret_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>

namespace rdmarpc {

std::string ReadSecretFile(const std::string& path, std::string_view what_view,
                           std::string* error) {
  const std::string what(what_view);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *error = "cannot read " + what + ": " + std::strerror(errno);
    return "";
  }
  if (!S_ISREG(st.st_mode)) {
    *error = what + " is not a regular file";
    return "";
  }
  std::string secret;
  try {
    std::ifstream in(path, std::ios::binary);
    secret.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      *error = "cannot read " + what;
      return "";
    }
  } catch (const std::exception& e) {
    *error = "cannot read " + what + ": " + e.what();
    return "";
  }
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) *error = what + " is empty";
  return secret;
}

}  // namespace rdmarpc
