// Generated code for what real .proto files contain compiles, and routes each call to the right
// handler: nested packages, imports, well-known types, proto2, several services per file,
// keyword and clashing method names, a file without a package, and every streaming kind.
#include <catch2/catch.hpp>

#include "test/protos/codegen/nopackage.rdmarpc.pb.h"
#include "test/protos/codegen/store.rdmarpc.pb.h"
#include "test/protos/codegen/streaming.rdmarpc.pb.h"
#include "test/test_util.h"

using namespace std::chrono_literals;
namespace store = acme::store::v1;
using google::protobuf::Empty;

namespace {

class InventoryImpl final : public store::Inventory::Service {
 public:
  boost::asio::awaitable<rdmarpc::Status> Add(rdmarpc::ServerContext&, const store::Item& item,
                                              Empty&) override {
    last_sku = item.sku();
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> delete_(rdmarpc::ServerContext&, const store::Item& item,
                                                  store::Status& reply) override {
    reply.set_text("deleted " + item.sku());
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> new_(rdmarpc::ServerContext&, const Empty&,
                                               store::Item_Tag& reply) override {
    reply.set_name("fresh");
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> class_(rdmarpc::ServerContext&, const store::Channel& c,
                                                 store::ServerContext& reply) override {
    reply.set_id(static_cast<int>(c.name().size()));
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> Service_(rdmarpc::ServerContext&,
                                                   const google::protobuf::StringValue& in,
                                                   google::protobuf::StringValue& out) override {
    out.set_value("svc:" + in.value());
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> Toggle(rdmarpc::ServerContext&, const store::switch_& in,
                                                 store::switch_& out) override {
    out.set_on(!in.on());
    co_return rdmarpc::Status();
  }
  std::string last_sku;
};

class BillingImpl final : public store::Billing::Service {
 public:
  boost::asio::awaitable<rdmarpc::Status> Add(rdmarpc::ServerContext&,
                                              const acme::common::v1::Money& m,
                                              acme::common::v1::Money& out) override {
    out.set_currency(m.currency());
    out.set_units(m.units() + 1);
    co_return rdmarpc::Status();
  }
};

class PingerImpl final : public Pinger::Service {
 public:
  boost::asio::awaitable<rdmarpc::Status> Ping(rdmarpc::ServerContext&, const PingRequest& req,
                                               PingReply& reply) override {
    reply.set_n(req.n() * 2);
    co_return rdmarpc::Status();
  }
};

class NothingImpl final : public store::Nothing::Service {};

// `service Service`: its class is Service_.
class ServiceNamedServiceImpl final : public store::Service_::Service {
 public:
  boost::asio::awaitable<rdmarpc::Status> Ping(rdmarpc::ServerContext&,
                                               const google::protobuf::StringValue& in,
                                               google::protobuf::StringValue& out) override {
    out.set_value("pong:" + in.value());
    co_return rdmarpc::Status();
  }
};
class StubImpl final : public store::Stub_::Service {};
class BlockingStubImpl final : public store::BlockingStub_::Service {};

}  // namespace

TEST_CASE("generated services with awkward names route every call to its own handler",
          "[codegen]") {
  InventoryImpl inventory;
  BillingImpl billing;
  PingerImpl pinger;
  NothingImpl nothing;
  ServiceNamedServiceImpl named_service;
  StubImpl named_stub;
  BlockingStubImpl named_blocking_stub;
  rdmarpc::Server server;
  REQUIRE(server.AddService(named_service).ok());
  REQUIRE(server.AddService(named_stub).ok());
  REQUIRE(server.AddService(named_blocking_stub).ok());
  CHECK(named_service.rdmarpc_service_name() == "acme.store.v1.Service");
  REQUIRE(server.AddService(inventory).ok());
  REQUIRE(server.AddService(billing).ok());
  REQUIRE(server.AddService(pinger).ok());
  REQUIRE(server.AddService(nothing).ok());
  CHECK(nothing.rdmarpc_methods().empty());
  CHECK(inventory.rdmarpc_service_name() == "acme.store.v1.Inventory");
  CHECK(inventory.rdmarpc_methods().size() == 10);
  // The same service twice is a method-id collision.
  BillingImpl billing2;
  CHECK(server.AddService(billing2).code() == rdmarpc::StatusCode::kAlreadyExists);

  auto bound = server.Listen("tcp://127.0.0.1:0");
  REQUIRE(bound.ok());
  server.Start();
  auto ch = rdmarpc::Channel::ConnectBlocking(*bound);
  REQUIRE(ch.ok());

  store::Inventory::BlockingStub inv(*ch);
  store::Item item;
  item.set_sku("sku-1");
  item.mutable_price()->set_currency("EUR");
  item.mutable_added()->set_seconds(1700000000);
  REQUIRE(inv.Add(item).ok());
  CHECK(inventory.last_sku == "sku-1");

  auto d = inv.delete_(item);
  REQUIRE(d.ok());
  CHECK(d->text() == "deleted sku-1");
  auto n = inv.new_(Empty());
  REQUIRE(n.ok());
  CHECK(n->name() == "fresh");
  store::Channel c;
  c.set_name("four");
  auto k = inv.class_(c);
  REQUIRE(k.ok());
  CHECK(k->id() == 4);
  google::protobuf::StringValue sv;
  sv.set_value("x");
  auto s = inv.Service_(sv);
  REQUIRE(s.ok());
  CHECK(s->value() == "svc:x");
  // Not overridden: the generated default answers UNIMPLEMENTED, naming the method.
  auto st = inv.Stub_(Empty());
  REQUIRE_FALSE(st.ok());
  CHECK(st.status().code() == rdmarpc::StatusCode::kUnimplemented);
  CHECK_THAT(st.status().message(), Catch::Contains("/acme.store.v1.Inventory/Stub"));
  CHECK(inv.BlockingStub_(Empty()).status().code() == rdmarpc::StatusCode::kUnimplemented);
  CHECK(inv.rdmarpc_methods_(Empty()).status().code() == rdmarpc::StatusCode::kUnimplemented);
  CHECK(inv.List(store::ListRequest()).status().code() == rdmarpc::StatusCode::kUnimplemented);

  store::switch_ sw;
  sw.set_on(false);
  auto t = inv.Toggle(sw);
  REQUIRE(t.ok());
  CHECK(t->on());

  // Same method name in two services of one file: each reaches its own service.
  store::Billing::BlockingStub bill(*ch);
  acme::common::v1::Money m;
  m.set_currency("USD");
  m.set_units(41);
  auto b = bill.Add(m);
  REQUIRE(b.ok());
  CHECK(b->units() == 42);
  CHECK(b->currency() == "USD");

  // Services named Service, Stub and BlockingStub work like any other.
  store::Service_::BlockingStub named(*ch);
  google::protobuf::StringValue hello;
  hello.set_value("hi");
  auto pong = named.Ping(hello);
  REQUIRE(pong.ok());
  CHECK(pong->value() == "pong:hi");
  store::BlockingStub_::BlockingStub named2(*ch);
  auto unimpl = named2.Service_(Empty());
  CHECK(unimpl.status().code() == rdmarpc::StatusCode::kUnimplemented);
  CHECK_THAT(unimpl.status().message(), Catch::Contains("/acme.store.v1.BlockingStub/Service"));

  Pinger::BlockingStub ping(*ch);
  PingRequest pr;
  pr.set_n(21);
  auto p = ping.Ping(pr);
  REQUIRE(p.ok());
  CHECK(p->n() == 42);
  server.Shutdown();
}

TEST_CASE("method ids are FNV-1a of the wire name and distinct per method", "[codegen]") {
  static_assert(rdmarpc::MethodId("") == 2166136261u);
  CHECK(rdmarpc::MethodId("/demo.Echo/Say") != rdmarpc::MethodId("/demo.Echo/Sax"));
  InventoryImpl inventory;
  std::set<uint32_t> ids;
  for (const auto& m : inventory.rdmarpc_methods()) {
    CHECK(m.info.id == rdmarpc::MethodId(m.info.full_name));
    ids.insert(m.info.id);
  }
  CHECK(ids.size() == inventory.rdmarpc_methods().size());
}

namespace {
namespace stream = acme::stream;

// All four kinds in one service (test/protos/codegen/streaming.proto).
class UploaderImpl final : public stream::Uploader::Service {
 public:
  boost::asio::awaitable<rdmarpc::Status> Ping(rdmarpc::ServerContext&, const stream::Chunk& in,
                                               stream::Chunk& out) override {
    out.set_data("pong:" + in.data());
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> Upload(rdmarpc::ServerContext&,
                                                 rdmarpc::ServerReader<stream::Chunk>& reader,
                                                 stream::switch_& reply) override {
    while (auto chunk = co_await reader.Read()) reply.set_chunks(reply.chunks() + 1);
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> Download(
      rdmarpc::ServerContext&, const stream::switch_& request,
      rdmarpc::ServerWriter<stream::Chunk_Meta>& writer) override {
    stream::Chunk_Meta meta;
    for (uint32_t i = 0; i < request.chunks(); ++i) {
      meta.set_name("part " + std::to_string(i));
      if (!co_await writer.Write(meta)) break;
    }
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> delete_(
      rdmarpc::ServerContext&,
      rdmarpc::ServerReaderWriter<stream::Chunk_Meta, stream::Chunk>& stream) override {
    stream::Chunk chunk;
    while (auto meta = co_await stream.Read()) {
      *chunk.mutable_meta() = *meta;
      if (!co_await stream.Write(chunk)) break;
    }
    co_return rdmarpc::Status();
  }
};

}  // namespace

TEST_CASE("generated code for every streaming kind compiles and routes", "[codegen][stream]") {
  UploaderImpl uploader;
  std::set<rdmarpc::MethodKind> kinds;
  for (const auto& m : uploader.rdmarpc_methods()) kinds.insert(m.info.kind);
  CHECK(kinds.size() == 4);
  rdmarpc::Server server;
  REQUIRE(server.AddService(uploader).ok());
  auto bound = server.Listen("tcp://127.0.0.1:0");
  REQUIRE(bound.ok());
  server.Start();
  auto ch = rdmarpc::Channel::ConnectBlocking(*bound);
  REQUIRE(ch.ok());
  stream::Uploader::BlockingStub stub(*ch);

  stream::Chunk chunk;
  chunk.set_data("x");
  auto pong = stub.Ping(chunk);
  REQUIRE(pong.ok());
  CHECK(pong->data() == "pong:x");

  auto up = stub.Upload();
  for (int i = 0; i < 3; ++i) REQUIRE(up.Write(chunk));
  auto uploaded = up.Finish();
  REQUIRE(uploaded.ok());
  CHECK(uploaded->chunks() == 3);

  stream::switch_ two;
  two.set_chunks(2);
  auto down = stub.Download(two);
  std::vector<std::string> names;
  while (auto meta = down.Read()) names.push_back(meta->name());
  CHECK(down.Finish().ok());
  CHECK(names == std::vector<std::string>{"part 0", "part 1"});

  auto bidi = stub.delete_();
  stream::Chunk_Meta meta;
  meta.set_name("m");
  REQUIRE(bidi.Write(meta));
  auto echoed = bidi.Read();
  REQUIRE(echoed.has_value());
  CHECK(echoed->meta().name() == "m");
  REQUIRE(bidi.WritesDone());
  CHECK_FALSE(bidi.Read().has_value());
  CHECK(bidi.Finish().ok());
  server.Shutdown();
}
