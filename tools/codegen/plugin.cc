// protoc-gen-rdmarpc: generates, for each service in a .proto file, a server base class with one
// virtual coroutine per method, a coroutine client Stub and a BlockingStub.
//
// Output for foo/bar.proto: foo/bar.rdmarpc.pb.h and foo/bar.rdmarpc.pb.cc, next to protoc's own
// foo/bar.pb.h. Streaming methods get stream handles (rpc/service.h on the server, rpc/stream.h on
// the client): server streams a ServerWriter and a ClientReader, client streams a ServerReader and
// a ClientWriter, bidirectional streams a ServerReaderWriter and a ClientReaderWriter.
#include <google/protobuf/compiler/code_generator.h>
#include <google/protobuf/compiler/plugin.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/io/printer.h>
#include <google/protobuf/io/zero_copy_stream.h>
#include <google/protobuf/unknown_field_set.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "rpc/method_id.h"

// Exported by libprotoc: the same keyword and namespace rules protoc's C++ generator applies to
// message names, so that our references to messages always match its class names.
namespace google::protobuf::compiler::cpp {
std::string ResolveKeyword(const std::string& name);
std::string Namespace(const std::string& package);
}  // namespace google::protobuf::compiler::cpp

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::MethodDescriptor;
using google::protobuf::ServiceDescriptor;
using google::protobuf::compiler::GeneratorContext;
using google::protobuf::io::Printer;
namespace cpp = google::protobuf::compiler::cpp;

std::string StripProto(const std::string& f) {
  if (f.size() > 6 && f.compare(f.size() - 6, 6, ".proto") == 0) return f.substr(0, f.size() - 6);
  if (f.size() > 9 && f.compare(f.size() - 9, 9, ".protodevel") == 0)
    return f.substr(0, f.size() - 9);
  return f;
}

// Mirrors protoc's ClassName(): nested messages join with '_', keywords get a trailing '_'.
std::string ClassName(const Descriptor* d) {
  std::string name = d->name();
  for (const Descriptor* p = d->containing_type(); p; p = p->containing_type()) {
    name = p->name() + "_" + name;
  }
  return cpp::ResolveKeyword(name);
}

std::string QualifiedClassName(const Descriptor* d) {
  std::string ns = cpp::Namespace(d->file()->package());
  return ns + "::" + ClassName(d);
}

// Method names become C++ member names next to names the generated classes already use.
std::string MethodName(const MethodDescriptor* m) {
  static const std::set<std::string> kTaken = {"Service", "Stub", "BlockingStub"};
  std::string name = cpp::ResolveKeyword(m->name());
  if (kTaken.count(name) || name.rfind("rdmarpc_", 0) == 0) name += "_";
  return name;
}

// A service's class holds classes named Service, Stub and BlockingStub: a service named like
// one of them would nest a class in a class of the same name, which C++ forbids.
std::string ServiceClassName(const ServiceDescriptor* s) {
  static const std::set<std::string> kNested = {"Service", "Stub", "BlockingStub"};
  std::string name = cpp::ResolveKeyword(s->name());
  if (kNested.count(name)) name += "_";
  return name;
}

std::string WireName(const MethodDescriptor* m) {
  return "/" + m->service()->full_name() + "/" + m->name();
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08xu", v);
  return buf;
}

// A C++ identifier unique to this file, for the helpers in the .cc's anonymous namespace.
enum class Kind { kUnary, kClientStreaming, kServerStreaming, kBidi };
Kind KindOf(const MethodDescriptor* m) {
  if (m->client_streaming()) return m->server_streaming() ? Kind::kBidi : Kind::kClientStreaming;
  return m->server_streaming() ? Kind::kServerStreaming : Kind::kUnary;
}

// Whether the method sets option (rdmarpc.inline_handler) (rpc/options.proto). The plugin does
// not link that file's generated code, so the option reaches it as an unknown field of the
// method's options, by its number.
constexpr int kInlineHandlerField = 50861;
bool InlineHandler(const MethodDescriptor* m) {
  const google::protobuf::MethodOptions& options = m->options();
  const google::protobuf::UnknownFieldSet& unknown =
      options.GetReflection()->GetUnknownFields(options);
  bool on = false;
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& f = unknown.field(i);
    if (f.number() == kInlineHandlerField &&
        f.type() == google::protobuf::UnknownField::TYPE_VARINT)
      on = f.varint() != 0;  // the last one set wins, as protobuf reads a repeated scalar
  }
  return on;
}

std::string FileTag(const FileDescriptor* file) {
  std::string tag = "rdmarpc_gen_";
  for (char c : StripProto(file->name()))
    tag += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return tag;
}

class Generator final : public google::protobuf::compiler::CodeGenerator {
 public:
  uint64_t GetSupportedFeatures() const override { return FEATURE_PROTO3_OPTIONAL; }

  bool Generate(const FileDescriptor* file, const std::string& /*parameter*/,
                GeneratorContext* context, std::string* error) const override {
    for (int i = 0; i < file->service_count(); ++i) {
      for (int j = 0; j < file->service(i)->method_count(); ++j) {
        const MethodDescriptor* m = file->service(i)->method(j);
        if (InlineHandler(m) && KindOf(m) != Kind::kUnary) {
          *error = m->full_name() +
                   ": option (rdmarpc.inline_handler) is for unary methods only (a stream's "
                   "handler waits for messages, so it must be a coroutine)";
          return false;
        }
      }
    }
    const std::string base = StripProto(file->name());
    {
      std::unique_ptr<google::protobuf::io::ZeroCopyOutputStream> out(
          context->Open(base + ".rdmarpc.pb.h"));
      Printer p(out.get(), '$');
      GenerateHeader(file, base, &p);
    }
    {
      std::unique_ptr<google::protobuf::io::ZeroCopyOutputStream> out(
          context->Open(base + ".rdmarpc.pb.cc"));
      Printer p(out.get(), '$');
      GenerateSource(file, base, &p);
    }
    return true;
  }

 private:
  // The server method's declaration (`in_class`: "Name(" with parameter names, for the base
  // class) or its definition's head ("Svc::Service::Name(" without names, for the default that
  // answers UNIMPLEMENTED).
  static std::string ServerSignature(const MethodDescriptor* m, bool in_class) {
    auto v = MethodVars(m);
    const std::string head =
        ReturnType(m) + " " + (in_class ? std::string() : v["svc"] + "::Service::") + v["name"] +
        "(\n    ::rdmarpc::ServerContext&" + (in_class ? " context" : "") + ", ";
    auto named = [&](const std::string& type, const std::string& name) {
      return in_class ? type + " " + name : type;
    };
    switch (KindOf(m)) {
      case Kind::kUnary:
        return head + named("const " + v["req"] + "&", "request") + ", " +
               named(v["resp"] + "&", "reply") + ")";
      case Kind::kServerStreaming:
        return head + named("const " + v["req"] + "&", "request") + ",\n    " +
               named("::rdmarpc::ServerWriter<" + v["resp"] + ">&", "writer") + ")";
      case Kind::kClientStreaming:
        return head + named("::rdmarpc::ServerReader<" + v["req"] + ">&", "reader") + ",\n    " +
               named(v["resp"] + "&", "reply") + ")";
      case Kind::kBidi:
        return head +
               named("::rdmarpc::ServerReaderWriter<" + v["req"] + ", " + v["resp"] + ">&",
                     "stream") +
               ")";
    }
    return head;
  }

  // What the server's handler returns: a coroutine, or for an inline handler the Status itself.
  static std::string ReturnType(const MethodDescriptor* m) {
    return InlineHandler(m) ? "::rdmarpc::Status" : "::boost::asio::awaitable<::rdmarpc::Status>";
  }

  // The invoker's parameters after the context (named as kArgs in GenerateSource uses them).
  static std::string InvokerSignature(const MethodDescriptor* m) {
    auto v = MethodVars(m);
    switch (KindOf(m)) {
      case Kind::kUnary:
        return "\n    const " + v["req"] + "& request, " + v["resp"] + "& reply";
      case Kind::kServerStreaming:
        return "\n    const " + v["req"] + "& request, ::rdmarpc::ServerWriter<" + v["resp"] +
               ">& writer";
      case Kind::kClientStreaming:
        return "\n    ::rdmarpc::ServerReader<" + v["req"] + ">& reader, " + v["resp"] + "& reply";
      case Kind::kBidi:
        return "\n    ::rdmarpc::ServerReaderWriter<" + v["req"] + ", " + v["resp"] + ">& stream";
    }
    return "";
  }

  static std::string NamespaceOf(const FileDescriptor* file) {
    std::string ns = cpp::Namespace(file->package());
    if (ns.rfind("::", 0) == 0) ns = ns.substr(2);
    return ns;
  }

  static std::map<std::string, std::string> MethodVars(const MethodDescriptor* m) {
    static const char* const kKinds[] = {"kUnary", "kClientStreaming", "kServerStreaming",
                                         "kBidiStreaming"};
    return {{"name", MethodName(m)},
            {"wire", WireName(m)},
            {"id", Hex(rdmarpc::MethodId(WireName(m)))},
            {"kind", kKinds[static_cast<int>(KindOf(m))]},
            {"req", QualifiedClassName(m->input_type())},
            {"resp", QualifiedClassName(m->output_type())},
            {"svc", ServiceClassName(m->service())}};
  }

  void GenerateHeader(const FileDescriptor* file, const std::string& base, Printer* p) const {
    p->Print(
        "// Generated by protoc-gen-rdmarpc from $file$. DO NOT EDIT.\n"
        "#pragma once\n\n"
        "#include \"$base$.pb.h\"\n"
        "#include \"rpc/generated.h\"\n\n",
        "file", file->name(), "base", base);
    const std::string ns = NamespaceOf(file);
    if (!ns.empty()) p->Print("namespace $ns$ {\n\n", "ns", ns);
    for (int i = 0; i < file->service_count(); ++i) {
      const ServiceDescriptor* s = file->service(i);
      p->Print(
          "// Service $full$.\n"
          "class $svc$ final {\n"
          " public:\n"
          "  $svc$() = delete;\n\n"
          "  // Derive from this, override the methods you serve and register it with\n"
          "  // rdmarpc::Server::AddService. Methods not overridden answer UNIMPLEMENTED.\n"
          "  class Service : public ::rdmarpc::Service {\n"
          "   public:\n"
          "    ~Service() override = default;\n",
          "full", s->full_name(), "svc", ServiceClassName(s));
      p->Indent();
      p->Indent();
      for (int j = 0; j < s->method_count(); ++j) {
        static const char* const kComments[] = {
            "// Inline handler (rpc/options.proto): runs on the connection's I/O thread and\n"
            "// must return without waiting; the reply goes out when it returns.\n",
            "// Client stream: read the requests until Read says there are no more, then\n"
            "// return the Status (and, when OK, `reply`).\n",
            "// Server stream: write any number of replies, then return the Status that\n"
            "// ends the stream.\n",
            "// Bidirectional stream: read and write in any order, then return the Status\n"
            "// that ends the call.\n"};
        auto vars = MethodVars(s->method(j));
        vars["sig"] = ServerSignature(s->method(j), true);
        if (KindOf(s->method(j)) != Kind::kUnary || InlineHandler(s->method(j)))
          p->Print(kComments[static_cast<int>(KindOf(s->method(j)))]);
        p->Print(vars, "virtual $sig$;\n");
      }
      p->Outdent();
      p->Outdent();
      p->Print(
          "    ::std::string_view rdmarpc_service_name() const final;\n"
          "    ::std::span<const ::rdmarpc::MethodEntry> rdmarpc_methods() const final;\n"
          "  };\n\n"
          "  // Coroutine client. `request` must outlive the co_await. Thread-compatible.\n"
          "  class Stub {\n"
          "   public:\n"
          "    explicit Stub(::std::shared_ptr<::rdmarpc::Channel> channel)\n"
          "        : rdmarpc_channel_(::std::move(channel)) {}\n");
      p->Indent();
      p->Indent();
      for (int j = 0; j < s->method_count(); ++j) {
        switch (KindOf(s->method(j))) {
          case Kind::kUnary:
            break;
          case Kind::kServerStreaming:
            p->Print(MethodVars(s->method(j)),
                     "// Server stream: read it with the returned reader (rpc/stream.h).\n"
                     "::boost::asio::awaitable<::rdmarpc::ClientReader<$resp$>> $name$(\n"
                     "    const $req$& request, const ::rdmarpc::CallOptions& options = {});\n");
            continue;
          case Kind::kClientStreaming:
            p->Print(MethodVars(s->method(j)),
                     "// Client stream: write the requests, then Finish for the reply "
                     "(rpc/stream.h).\n"
                     "::boost::asio::awaitable<::rdmarpc::ClientWriter<$req$, $resp$>> $name$(\n"
                     "    const ::rdmarpc::CallOptions& options = {});\n");
            continue;
          case Kind::kBidi:
            p->Print(MethodVars(s->method(j)),
                     "// Bidirectional stream: write and read through the returned handle "
                     "(rpc/stream.h).\n"
                     "::boost::asio::awaitable<::rdmarpc::ClientReaderWriter<$req$, $resp$>> "
                     "$name$(\n"
                     "    const ::rdmarpc::CallOptions& options = {});\n");
            continue;
        }
        p->Print(MethodVars(s->method(j)),
                 "::boost::asio::awaitable<::rdmarpc::Result<$resp$>> $name$(\n"
                 "    const $req$& request, const ::rdmarpc::CallOptions& options = {});\n"
                 "// Fills `reply` (which must outlive the co_await) instead of returning it.\n"
                 "::boost::asio::awaitable<::rdmarpc::Status> $name$(\n"
                 "    const $req$& request, $resp$& reply,\n"
                 "    const ::rdmarpc::CallOptions& options = {});\n"
                 "// The same as an Asio asynchronous operation completing with the Status\n"
                 "// through `token`: `co_await stub.$name$(request, reply, options,\n"
                 "// boost::asio::deferred)` costs no coroutine frame of its own. `options`\n"
                 "// too must outlive it (rdmarpc::Channel::Call).\n"
                 "template <class CompletionToken>\n"
                 "auto $name$(const $req$& request, $resp$& reply,\n"
                 "    const ::rdmarpc::CallOptions& options, CompletionToken&& token) {\n"
                 "  return rdmarpc_channel_->Call(rdmarpc_$name$_info, request, reply, options,\n"
                 "      ::std::forward<CompletionToken>(token));\n"
                 "}\n");
      }
      p->Outdent();
      p->Outdent();
      p->Print("   private:\n");
      p->Indent();
      p->Indent();
      for (int j = 0; j < s->method_count(); ++j) {
        if (KindOf(s->method(j)) != Kind::kUnary) continue;
        p->Print(MethodVars(s->method(j)),
                 "static constexpr ::rdmarpc::MethodInfo rdmarpc_$name$_info{\"$wire$\", $id$,\n"
                 "    ::rdmarpc::MethodKind::kUnary};\n");
      }
      p->Outdent();
      p->Outdent();
      p->Print(
          "    ::std::shared_ptr<::rdmarpc::Channel> rdmarpc_channel_;\n"
          "  };\n\n"
          "  // Blocking client for ordinary code. Not for use on the channel's own thread.\n"
          "  class BlockingStub {\n"
          "   public:\n"
          "    explicit BlockingStub(::std::shared_ptr<::rdmarpc::Channel> channel)\n"
          "        : rdmarpc_channel_(::std::move(channel)) {}\n");
      p->Indent();
      p->Indent();
      for (int j = 0; j < s->method_count(); ++j) {
        switch (KindOf(s->method(j))) {
          case Kind::kUnary:
            break;
          case Kind::kServerStreaming:
            p->Print(MethodVars(s->method(j)),
                     "::rdmarpc::BlockingReader<$resp$> $name$(\n"
                     "    const $req$& request, const ::rdmarpc::CallOptions& options = {});\n");
            continue;
          case Kind::kClientStreaming:
            p->Print(MethodVars(s->method(j)),
                     "::rdmarpc::BlockingWriter<$req$, $resp$> $name$(\n"
                     "    const ::rdmarpc::CallOptions& options = {});\n");
            continue;
          case Kind::kBidi:
            p->Print(MethodVars(s->method(j)),
                     "::rdmarpc::BlockingReaderWriter<$req$, $resp$> $name$(\n"
                     "    const ::rdmarpc::CallOptions& options = {});\n");
            continue;
        }
        p->Print(MethodVars(s->method(j)),
                 "::rdmarpc::Result<$resp$> $name$(\n"
                 "    const $req$& request, const ::rdmarpc::CallOptions& options = {});\n");
      }
      p->Outdent();
      p->Outdent();
      p->Print(
          "   private:\n"
          "    ::std::shared_ptr<::rdmarpc::Channel> rdmarpc_channel_;\n"
          "  };\n"
          "};\n\n");
    }
    if (!ns.empty()) p->Print("}  // namespace $ns$\n", "ns", ns);
  }

  void GenerateSource(const FileDescriptor* file, const std::string& base, Printer* p) const {
    const std::string tag = FileTag(file);
    p->Print(
        "// Generated by protoc-gen-rdmarpc from $file$. DO NOT EDIT.\n"
        "#include \"$base$.rdmarpc.pb.h\"\n\n",
        "file", file->name(), "base", base);
    const std::string ns = NamespaceOf(file);
    const std::string qns = ns.empty() ? "" : "::" + ns;
    if (file->service_count() == 0) return;

    // Method tables and invokers, out of the package namespace so no user name can clash.
    p->Print("namespace {\nnamespace $tag$ {\n\n", "tag", tag);
    for (int i = 0; i < file->service_count(); ++i) {
      const ServiceDescriptor* s = file->service(i);
      for (int j = 0; j < s->method_count(); ++j) {
        auto vars = MethodVars(s->method(j));
        vars["qsvc"] = qns + "::" + ServiceClassName(s);
        vars["j"] = std::to_string(j);
        static const char* const kHandlers[] = {
            "UnaryMethodHandler", "ClientStreamingMethodHandler", "ServerStreamingMethodHandler",
            "BidiStreamingMethodHandler"};
        static const char* const kArgs[] = {"request, reply", "reader, reply", "request, writer",
                                            "stream"};
        const int kind = static_cast<int>(KindOf(s->method(j)));
        vars["handler"] = kHandlers[kind];
        vars["inline"] = InlineHandler(s->method(j)) ? ", true" : "";
        vars["ret"] = ReturnType(s->method(j));
        vars["args"] = kArgs[kind];
        p->Print(vars,
                 "constexpr ::rdmarpc::MethodInfo k$svc$_$j$_info{\"$wire$\", $id$,\n"
                 "                                             ::rdmarpc::MethodKind::$kind$};\n");
        vars["sig"] = InvokerSignature(s->method(j));
        p->Print(vars,
                 "$ret$ $svc$_$j$_invoke(\n"
                 "    ::rdmarpc::Service& service, ::rdmarpc::ServerContext& context, $sig$) {\n"
                 "  return static_cast<$qsvc$::Service&>(service).$name$(context, $args$);\n"
                 "}\n"
                 "const ::rdmarpc::$handler$<$req$, $resp$$inline$> k$svc$_$j$_handler(\n"
                 "    &$svc$_$j$_invoke);\n\n");
      }
      if (s->method_count() > 0) {
        p->Print("const ::rdmarpc::MethodEntry k$svc$_methods[] = {\n", "svc", ServiceClassName(s));
        for (int j = 0; j < s->method_count(); ++j) {
          p->Print("    {k$svc$_$j$_info, &k$svc$_$j$_handler},\n", "svc", ServiceClassName(s), "j",
                   std::to_string(j));
        }
        p->Print("};\n\n");
      }
    }
    p->Print("}  // namespace $tag$\n}  // namespace\n\n", "tag", tag);

    if (!ns.empty()) p->Print("namespace $ns$ {\n\n", "ns", ns);
    for (int i = 0; i < file->service_count(); ++i) {
      const ServiceDescriptor* s = file->service(i);
      std::map<std::string, std::string> sv = {
          {"svc", ServiceClassName(s)}, {"full", s->full_name()}, {"tag", tag}};
      p->Print(
          sv,
          "::std::string_view $svc$::Service::rdmarpc_service_name() const {\n"
          "  return \"$full$\";\n"
          "}\n\n"
          "::std::span<const ::rdmarpc::MethodEntry> $svc$::Service::rdmarpc_methods() const {\n");
      if (s->method_count() > 0) {
        p->Print(sv, "  return ::$tag$::k$svc$_methods;\n}\n\n");
      } else {
        p->Print("  return {};\n}\n\n");
      }
      for (int j = 0; j < s->method_count(); ++j) {
        auto vars = MethodVars(s->method(j));
        vars["tag"] = tag;
        vars["j"] = std::to_string(j);
        vars["sig"] = ServerSignature(s->method(j), false);
        vars["return"] = InlineHandler(s->method(j)) ? "return" : "co_return";
        p->Print(vars,
                 "$sig$ {\n"
                 "  $return$ ::rdmarpc::Status(\n"
                 "      ::rdmarpc::StatusCode::kUnimplemented,\n"
                 "      \"method $wire$ is not implemented by this server\");\n"
                 "}\n\n");
        if (KindOf(s->method(j)) == Kind::kClientStreaming || KindOf(s->method(j)) == Kind::kBidi) {
          vars["handle"] = KindOf(s->method(j)) == Kind::kBidi ? "ReaderWriter" : "Writer";
          p->Print(
              vars,
              "::boost::asio::awaitable<::rdmarpc::Client$handle$<$req$, $resp$>>\n"
              "$svc$::Stub::$name$(const ::rdmarpc::CallOptions& options) {\n"
              "  co_return ::rdmarpc::Client$handle$<$req$, $resp$>(\n"
              "      co_await rdmarpc_channel_->OpenStream(::$tag$::k$svc$_$j$_info, options));\n"
              "}\n\n"
              "::rdmarpc::Blocking$handle$<$req$, $resp$> $svc$::BlockingStub::$name$(\n"
              "    const ::rdmarpc::CallOptions& options) {\n"
              "  return ::rdmarpc::Blocking$handle$<$req$, $resp$>(\n"
              "      rdmarpc_channel_, "
              "rdmarpc_channel_->Run(Stub(rdmarpc_channel_).$name$(options)));\n"
              "}\n\n");
          continue;
        }
        if (KindOf(s->method(j)) == Kind::kServerStreaming) {
          p->Print(
              vars,
              "::boost::asio::awaitable<::rdmarpc::ClientReader<$resp$>> $svc$::Stub::$name$(\n"
              "    const $req$& request, const ::rdmarpc::CallOptions& options) {\n"
              "  co_return ::rdmarpc::ClientReader<$resp$>(co_await rdmarpc_channel_->OpenStream(\n"
              "      ::$tag$::k$svc$_$j$_info, request, options));\n"
              "}\n\n"
              "::rdmarpc::BlockingReader<$resp$> $svc$::BlockingStub::$name$(\n"
              "    const $req$& request, const ::rdmarpc::CallOptions& options) {\n"
              "  return ::rdmarpc::BlockingReader<$resp$>(\n"
              "      rdmarpc_channel_, "
              "rdmarpc_channel_->Run(Stub(rdmarpc_channel_).$name$(request, options)));\n"
              "}\n\n");
          continue;
        }
        p->Print(
            vars,
            "::boost::asio::awaitable<::rdmarpc::Result<$resp$>> $svc$::Stub::$name$(\n"
            "    const $req$& request, const ::rdmarpc::CallOptions& options) {\n"
            "  $resp$ reply;\n"
            "  ::rdmarpc::Status status = co_await rdmarpc_channel_->Call(\n"
            "      rdmarpc_$name$_info, request, reply, options);\n"
            "  if (!status.ok()) co_return status;\n"
            "  co_return ::std::move(reply);\n"
            "}\n\n"
            "::boost::asio::awaitable<::rdmarpc::Status> $svc$::Stub::$name$(\n"
            "    const $req$& request, $resp$& reply, const ::rdmarpc::CallOptions& options) {\n"
            "  return rdmarpc_channel_->Call(rdmarpc_$name$_info, request, reply, options);\n"
            "}\n\n"
            "::rdmarpc::Result<$resp$> $svc$::BlockingStub::$name$(\n"
            "    const $req$& request, const ::rdmarpc::CallOptions& options) {\n"
            "  return rdmarpc_channel_->Run(Stub(rdmarpc_channel_).$name$(request, options));\n"
            "}\n\n");
      }
    }
    if (!ns.empty()) p->Print("}  // namespace $ns$\n", "ns", ns);
  }
};

}  // namespace

int main(int argc, char* argv[]) {
  Generator generator;
  return google::protobuf::compiler::PluginMain(argc, argv, &generator);
}
