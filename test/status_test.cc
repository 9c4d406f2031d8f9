// Status's text for people and logs: EscapeForDisplay and Status::ToString. A message can come
// from the peer; printed raw it could forge log lines or drive the reader's terminal.
#include "rpc/status.h"

#include <catch2/catch.hpp>
#include <string>

using rdmarpc::EscapeForDisplay;
using rdmarpc::Status;
using rdmarpc::StatusCode;

TEST_CASE("EscapeForDisplay keeps printable text, UTF-8 included", "[status]") {
  CHECK(EscapeForDisplay("connection to tcp://127.0.0.1:7471 lost") ==
        "connection to tcp://127.0.0.1:7471 lost");
  CHECK(EscapeForDisplay("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");  // é, €, an emoji
  CHECK(EscapeForDisplay("back\\slash") == "back\\slash");
  CHECK(EscapeForDisplay("") == "");
}

TEST_CASE("EscapeForDisplay escapes C0 controls and DEL", "[status]") {
  CHECK(EscapeForDisplay("a\nFORGED") == "a\\nFORGED");
  CHECK(EscapeForDisplay("\r\t") == "\\r\\t");
  CHECK(EscapeForDisplay("\x1b]0;title\x07") == "\\x1b]0;title\\x07");
  CHECK(EscapeForDisplay(std::string("nul\0end", 7)) == "nul\\x00end");
  CHECK(EscapeForDisplay("\x7f") == "\\x7f");
}

TEST_CASE("EscapeForDisplay escapes C1 controls, bidirectional overrides and line separators",
          "[status]") {
  CHECK(EscapeForDisplay("\xc2\x9b"
                         "31m") == "\\u009b31m");    // CSI written as UTF-8
  CHECK(EscapeForDisplay("\xc2\x85") == "\\u0085");  // NEL
  CHECK(EscapeForDisplay("\xe2\x80\xae"
                         "txt.exe") == "\\u202etxt.exe");  // RIGHT-TO-LEFT OVERRIDE
  CHECK(EscapeForDisplay("\xe2\x81\xa6") == "\\u2066");    // LEFT-TO-RIGHT ISOLATE
  CHECK(EscapeForDisplay("\xe2\x80\xa8") == "\\u2028");    // LINE SEPARATOR
  CHECK(EscapeForDisplay("\xc2\xa0") == "\xc2\xa0");       // NO-BREAK SPACE is printable
}

TEST_CASE("EscapeForDisplay writes bytes that are not UTF-8 as \\xNN", "[status]") {
  CHECK(EscapeForDisplay("\x9b") == "\\x9b");  // a lone 8-bit CSI
  CHECK(EscapeForDisplay("\xff\xfe") == "\\xff\\xfe");
  CHECK(EscapeForDisplay("\xc3") == "\\xc3");                             // cut short
  CHECK(EscapeForDisplay("\xc3(") == "\\xc3(");                           // bad continuation
  CHECK(EscapeForDisplay("\xc0\xaf") == "\\xc0\\xaf");                    // overlong '/'
  CHECK(EscapeForDisplay("\xe0\x80\xaf") == "\\xe0\\x80\\xaf");           // overlong, 3 bytes
  CHECK(EscapeForDisplay("\xed\xa0\x80") == "\\xed\\xa0\\x80");           // a surrogate
  CHECK(EscapeForDisplay("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
}

TEST_CASE("Status::ToString escapes the message; message() keeps it as sent", "[status]") {
  const std::string sent = "no such key\n[12:00:00.000] [info] FORGED\x1b[2J";
  Status s(StatusCode::kNotFound, sent);
  CHECK(s.message() == sent);
  CHECK(s.ToString() == "NOT_FOUND: no such key\\n[12:00:00.000] [info] FORGED\\x1b[2J");
  CHECK(Status().ToString() == "OK");
  CHECK(Status(StatusCode::kUnavailable, "connection closed").ToString() ==
        "UNAVAILABLE: connection closed");
}
