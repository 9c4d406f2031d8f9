// greeter_client [URI] [NAME]: three calls to greeter.Greeter, then one the server refuses.
#include <google/protobuf/util/time_util.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <cstdio>

#include "greeter/greeter.rdmarpc.pb.h"
#include "rpc/rdmarpc.h"

using namespace std::chrono_literals;
using google::protobuf::util::TimeUtil;

// A coroutine: each co_await suspends it until the answer is in, without blocking the thread.
boost::asio::awaitable<int> Greet(std::string uri, std::string name) {
  rdmarpc::ChannelOptions options;
  options.transport.max_message_bytes = 1 << 20;  // as the server: larger messages fail
  // The channel lives on this coroutine's executor (the io_context in main).
  auto channel = co_await rdmarpc::Channel::Connect(uri, options);
  if (!channel.ok()) {
    std::fprintf(stderr, "greeter_client: %s\n", channel.status().ToString().c_str());
    co_return 3;
  }
  greeter::Greeter::Stub stub(*channel);

  greeter::HelloRequest req;
  req.mutable_person()->set_name(name);
  for (const char* language : {"en", "fr", "en"}) {
    req.mutable_person()->clear_languages();
    req.mutable_person()->add_languages(language);
    rdmarpc::Result<greeter::HelloReply> r = co_await stub.Hello(req, {.timeout = 1s});
    if (!r.ok()) {  // UNAVAILABLE, DEADLINE_EXCEEDED, or the handler's own Status
      std::fprintf(stderr, "greeter_client: %s\n", r.status().ToString().c_str());
      co_return 1;
    }
    std::printf("%s (answer %llu, served at %s)\n", r->greeting().c_str(),
                static_cast<unsigned long long>(r->count()),
                TimeUtil::ToString(r->served_at()).c_str());
  }

  // The completion-token form: with asio::deferred, no coroutine frame of the call's own (the
  // cheapest way to call; request, reply and options must outlive the co_await).
  req.mutable_person()->clear_name();
  greeter::HelloReply reply;
  const rdmarpc::CallOptions call_options{.timeout = 1s};
  rdmarpc::Status refused = co_await stub.Hello(req, reply, call_options, boost::asio::deferred);
  std::printf("without a name: %s\n", refused.ToString().c_str());
  co_return refused.code() == rdmarpc::StatusCode::kInvalidArgument ? 0 : 1;
}

int main(int argc, char** argv) {
  // One io_context run by one thread (this one): a channel's io_context must be run by a single
  // thread. Several channels may share it; to use more cores, run one io_context per thread.
  boost::asio::io_context io(1);
  std::future<int> done = boost::asio::co_spawn(
      io, Greet(argc > 1 ? argv[1] : "tcp://127.0.0.1:7500", argc > 2 ? argv[2] : "world"),
      boost::asio::use_future);
  io.run();  // returns once Greet has finished and its channel is closed
  return done.get();
}
