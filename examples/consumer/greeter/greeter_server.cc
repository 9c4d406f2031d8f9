// greeter_server [URI]: serves greeter.Greeter until SIGINT or SIGTERM.
#include <google/protobuf/util/time_util.h>

#include <atomic>
#include <cstdio>

#include "greeter/greeter.rdmarpc.pb.h"  // generated from greeter/greeter.proto
#include "rpc/rdmarpc.h"

// One instance serves every connection. Handlers run on the server's I/O threads, several at
// once when io_threads > 1, so shared state must be thread-safe (here: an atomic).
// greeter.proto marks Hello `option (rdmarpc.inline_handler) = true;`, so it is a plain
// function rather than a coroutine: it answers at once, without waiting on anything.
class GreeterImpl final : public greeter::Greeter::Service {
 public:
  rdmarpc::Status Hello(rdmarpc::ServerContext&, const greeter::HelloRequest& req,
                        greeter::HelloReply& reply) override {
    const greeter::Person& who = req.person();
    if (who.name().empty()) {
      // The caller gets this code and message; the server carries on.
      return rdmarpc::Status(rdmarpc::StatusCode::kInvalidArgument, "person.name is empty");
    }
    const bool french = !who.languages().empty() && who.languages(0) == "fr";
    reply.set_greeting((french ? "bonjour, " : "hello, ") + who.name());
    reply.set_count(++answered_);
    *reply.mutable_served_at() = google::protobuf::util::TimeUtil::GetCurrentTime();
    return rdmarpc::Status();  // OK: the reply is sent
  }

 private:
  std::atomic<uint64_t> answered_{0};
};

int main(int argc, char** argv) {
  const std::string uri = argc > 1 ? argv[1] : "tcp://127.0.0.1:7500";  // or rdma://ADDR:PORT
  rdmarpc::ServerOptions options;
  options.io_threads = 2;
  options.handle_signals = true;  // SIGINT/SIGTERM: finish running calls, then Run() returns
  // The largest message (request or reply) a connection takes; bigger ones fail with
  // RESOURCE_EXHAUSTED and the connection stays up. Default: 64 MiB. Clients set their own in
  // ChannelOptions::transport.
  options.transport.max_message_bytes = 1 << 20;

  GreeterImpl greeter;  // must outlive the server
  rdmarpc::Server server(options);
  if (auto added = server.AddService(greeter); !added.ok()) {
    std::fprintf(stderr, "greeter_server: %s\n", added.ToString().c_str());
    return 1;
  }
  auto bound = server.Listen(uri);  // port 0 picks a free port: `bound` says which
  if (!bound.ok()) {
    std::fprintf(stderr, "greeter_server: %s\n", bound.status().ToString().c_str());
    return 1;
  }
  std::printf("listening on %s\n", bound->c_str());
  std::fflush(stdout);
  server.Run();  // blocks: the I/O threads serve until a signal (or Shutdown())
  return 0;
}
