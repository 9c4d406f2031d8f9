// Reading a shared secret (transport::Options::auth_secret) from a file, for programs that take
// one on the command line: from a file, never the command line itself, where `ps` would show it.
// A library of its own (//rpc:secret_file, no dependencies) so that flag parsers can use it.
#pragma once

#include <string>
#include <string_view>

namespace rdmarpc {

// The contents of `path` without trailing newlines. When it cannot be read, is not a regular
// file or is empty: "" and `*error` says which, calling the file `what` (e.g.
// "--auth-secret-file /etc/app/secret").
std::string ReadSecretFile(const std::string& path, std::string_view what, std::string* error);

}  // namespace rdmarpc
