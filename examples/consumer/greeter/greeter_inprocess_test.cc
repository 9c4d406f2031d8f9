// A cc_test (linked the way Bazel links tests by default, against shared objects of the
// libraries) with a server and a client in one process, over tcp://127.0.0.1.
#include <cstdio>

#include "greeter/greeter.rdmarpc.pb.h"
#include "rpc/rdmarpc.h"

class Greeter final : public greeter::Greeter::Service {
  rdmarpc::Status Hello(rdmarpc::ServerContext&, const greeter::HelloRequest& req,
                        greeter::HelloReply& reply) override {  // inline (greeter.proto)
    reply.set_greeting("hello, " + req.person().name());
    return rdmarpc::Status();
  }
};

int main() {
  Greeter impl;
  rdmarpc::Server server;
  if (!server.AddService(impl).ok()) return 1;
  auto uri = server.Listen("tcp://127.0.0.1:0");
  if (!uri.ok()) return 1;
  server.Start();
  auto channel = rdmarpc::Channel::ConnectBlocking(*uri);
  if (!channel.ok()) return 1;
  greeter::Greeter::BlockingStub stub(*channel);
  greeter::HelloRequest req;
  req.mutable_person()->set_name("Grace");
  auto reply = stub.Hello(req);
  std::printf("%s\n", reply.ok() ? reply->greeting().c_str() : reply.status().ToString().c_str());
  server.Shutdown();
  return reply.ok() && reply->greeting() == "hello, Grace" ? 0 : 1;
}
