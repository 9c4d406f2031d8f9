// A server whose reflection service lies, for cli_hostile_server_test.sh: what a broken or
// ill-willed server can make the `rdmarpc` tool do. It hosts demo.Echo (proto/echo.proto) and a
// Reflection service of its own that answers per --case:
//   garbage      FileContainingSymbol sends bytes that are no FileDescriptorProto
//   unbuildable  a file whose message uses a type defined nowhere
//   cycle        two files that import each other
//   escapes      a file named with terminal escape sequences and a newline; demo.Echo as in
//                echo.proto, but Say's replies carry escapes in served_by
//   deep         demo.SayReply's field 2 declared as a message that contains itself, and Say
//                replies with 100,000 levels of it nested in that field
//   error        FileContainingSymbol fails NOT_FOUND with escapes and a newline in its message
// ListServices always names demo.Echo and a service name carrying escapes and a newline.
// Prints "listening on URI" and serves until killed.
#include <google/protobuf/descriptor.pb.h>

#include <iostream>
#include <string>
#include <vector>

#include "proto/echo.rdmarpc.pb.h"
#include "rpc/rdmarpc.h"
#include "rpc/reflection.rdmarpc.pb.h"

namespace {

namespace reflection = rdmarpc::reflection::v1;
using google::protobuf::DescriptorProto;
using google::protobuf::FieldDescriptorProto;
using google::protobuf::FileDescriptorProto;

// An OSC sequence that retitles a terminal window, a screen clear and a forged log line.
constexpr char kEscapes[] = "\x1b]0;owned\x07\x1b[2J\nFORGED LINE";

// `levels` messages nested in each other's field 1 (length-delimited), the innermost empty.
std::string Nested(int levels) {
  std::vector<size_t> content(levels);  // the size of each level's field contents, inside out
  auto varint_bytes = [](size_t n) {
    size_t b = 1;
    for (; n >= 0x80; n >>= 7) ++b;
    return b;
  };
  for (int k = 1; k < levels; ++k) content[k] = 1 + varint_bytes(content[k - 1]) + content[k - 1];
  std::string s;
  for (int k = levels - 1; k >= 0; --k) {  // outermost first
    s.push_back(0x0a);                     // field 1, wire type 2
    size_t n = content[k];
    for (; n >= 0x80; n >>= 7) s.push_back(static_cast<char>((n & 0x7f) | 0x80));
    s.push_back(static_cast<char>(n));
  }
  return s;
}

void AddField(DescriptorProto* m, const std::string& name, int number,
              FieldDescriptorProto::Type type, const std::string& type_name = "") {
  FieldDescriptorProto* f = m->add_field();
  f->set_name(name);
  f->set_number(number);
  f->set_label(FieldDescriptorProto::LABEL_OPTIONAL);
  f->set_type(type);
  if (!type_name.empty()) f->set_type_name(type_name);
}

// demo.Echo's file as echo.proto has it, except as `kase` says.
FileDescriptorProto EchoFile(const std::string& kase) {
  FileDescriptorProto file;
  file.set_name(kase == "escapes" ? std::string("echo") + kEscapes + ".proto" : "echo.proto");
  file.set_package("demo");
  file.set_syntax("proto3");
  DescriptorProto* request = file.add_message_type();
  request->set_name("SayRequest");
  AddField(request, "message", 1, FieldDescriptorProto::TYPE_STRING);
  AddField(request, "payload", 2, FieldDescriptorProto::TYPE_BYTES);
  DescriptorProto* reply = file.add_message_type();
  reply->set_name("SayReply");
  AddField(reply, "message", 1, FieldDescriptorProto::TYPE_STRING);
  if (kase == "deep") {
    AddField(reply, "payload", 2, FieldDescriptorProto::TYPE_MESSAGE, ".demo.Node");
    DescriptorProto* node = file.add_message_type();
    node->set_name("Node");
    AddField(node, "child", 1, FieldDescriptorProto::TYPE_MESSAGE, ".demo.Node");
  } else if (kase == "unbuildable") {
    AddField(reply, "payload", 2, FieldDescriptorProto::TYPE_MESSAGE, ".demo.Missing");
  } else {
    AddField(reply, "payload", 2, FieldDescriptorProto::TYPE_BYTES);
  }
  AddField(reply, "served_by", 3, FieldDescriptorProto::TYPE_STRING);
  auto* service = file.add_service();
  service->set_name("Echo");
  auto* say = service->add_method();
  say->set_name("Say");
  say->set_input_type(".demo.SayRequest");
  say->set_output_type(".demo.SayReply");
  return file;
}

class LyingReflection final : public reflection::Reflection::Service {
 public:
  explicit LyingReflection(std::string kase) : case_(std::move(kase)) {}

  boost::asio::awaitable<rdmarpc::Status> ListServices(
      rdmarpc::ServerContext&, const reflection::ListServicesRequest&,
      reflection::ListServicesResponse& reply) override {
    reply.add_services("demo.Echo");
    reply.add_services(std::string("demo.Fake") + kEscapes);
    co_return rdmarpc::Status();
  }

  boost::asio::awaitable<rdmarpc::Status> FileContainingSymbol(
      rdmarpc::ServerContext&, const reflection::FileContainingSymbolRequest&,
      reflection::FileContainingSymbolResponse& reply) override {
    if (case_ == "error") {
      co_return rdmarpc::Status(rdmarpc::StatusCode::kNotFound, std::string("no") + kEscapes);
    }
    if (case_ == "garbage") {
      reply.add_file_descriptor_protos("\xff\xff\xff\xff");
      co_return rdmarpc::Status();
    }
    if (case_ == "cycle") {
      FileDescriptorProto a = EchoFile(case_), b;
      a.add_dependency("other.proto");
      b.set_name("other.proto");
      b.add_dependency("echo.proto");
      a.SerializeToString(reply.add_file_descriptor_protos());
      b.SerializeToString(reply.add_file_descriptor_protos());
      co_return rdmarpc::Status();
    }
    EchoFile(case_).SerializeToString(reply.add_file_descriptor_protos());
    co_return rdmarpc::Status();
  }

 private:
  std::string case_;
};

class Echo final : public demo::Echo::Service {
 public:
  explicit Echo(std::string kase) : case_(std::move(kase)) {}
  boost::asio::awaitable<rdmarpc::Status> Say(rdmarpc::ServerContext&,
                                              const demo::SayRequest& request,
                                              demo::SayReply& reply) override {
    reply.set_message(request.message());
    if (case_ == "deep") reply.set_payload(Nested(100000));
    reply.set_served_by(std::string("a server") + kEscapes);
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> Chat(
      rdmarpc::ServerContext&,
      rdmarpc::ServerReaderWriter<demo::SayRequest, demo::SayReply>&) override {
    co_return rdmarpc::Status(rdmarpc::StatusCode::kUnimplemented, "not here");
  }

 private:
  std::string case_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--case") {
    std::cerr << "usage: hostile_reflection_server --case NAME\n";
    return 2;
  }
  const std::string kase = argv[2];
  Echo echo(kase);
  LyingReflection lies(kase);
  rdmarpc::Server server;
  if (!server.AddService(echo).ok() || !server.AddService(lies).ok()) return 1;
  auto bound = server.Listen("tcp://127.0.0.1:0");
  if (!bound.ok()) {
    std::cerr << bound.status().ToString() << "\n";
    return 1;
  }
  std::cout << "listening on " << *bound << std::endl;
  server.Run();
  return 0;
}
