#include "rpc/metrics.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "rpc/server.h"
#include "rpc/service.h"
#include "transport/stats.h"

namespace rdmarpc {
namespace {

// One method's series on one side (Recorder: internal::ServerStatsRecorder or
// ClientStatsRecorder), found once (ForMethod) rather than by name on every call. The runtime
// records into its stats() itself where it comes first in its list.
template <class Recorder>
class MethodMetrics final : public Recorder {
 public:
  MethodMetrics(std::shared_ptr<Metrics> metrics, internal::MethodStats& stats)
      : Recorder(stats), metrics_(std::move(metrics)) {}

 private:
  std::shared_ptr<Metrics> metrics_;  // keeps stats() alive
};

class ServerMetricsInterceptor final : public ServerInterceptor {
 public:
  explicit ServerMetricsInterceptor(std::shared_ptr<Metrics> metrics)
      : metrics_(std::move(metrics)) {}
  // The server binds every method it hosts (Server::AddService), so the calls themselves are
  // seen only by what this returns.
  std::shared_ptr<ServerInterceptor> ForMethod(const MethodInfo& method) override {
    return std::make_shared<MethodMetrics<internal::ServerStatsRecorder>>(
        metrics_, metrics_->server_methods().Get(method.full_name));
  }

 private:
  std::shared_ptr<Metrics> metrics_;
};

class ClientMetricsInterceptor final : public ClientInterceptor {
 public:
  explicit ClientMetricsInterceptor(std::shared_ptr<Metrics> metrics)
      : metrics_(std::move(metrics)) {}
  std::shared_ptr<ClientInterceptor> ForMethod(const MethodInfo& method) override {
    return std::make_shared<MethodMetrics<internal::ClientStatsRecorder>>(
        metrics_, metrics_->client_methods().Get(method.full_name));
  }
  // Only for a method whose ForMethod answer the channel cannot use: a second method name with
  // an id already bound (see ChannelCore::InterceptorsFor).
  Status OnStart(const MethodInfo& method, CallOptions&) override {
    metrics_->client_methods().Get(method.full_name).Started();
    return Status();
  }
  void OnFinish(const MethodInfo& method, const Status& status,
                std::chrono::nanoseconds elapsed) override {
    metrics_->client_methods().Get(method.full_name).Finished(status.code(), elapsed, 0, 0);
  }

 private:
  std::shared_ptr<Metrics> metrics_;
};

// Appends the text format, one family at a time.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void Family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    for (char c : help) {  // the format's escapes for help text
      if (c == '\\') {
        out_ += "\\\\";
      } else if (c == '\n') {
        out_ += "\\n";
      } else {
        out_ += c;
      }
    }
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  // `labels` is already formatted ("" or `a="b",c="d"`).
  void Sample(std::string_view name, std::string_view labels, double value) {
    char num[64];
    std::snprintf(num, sizeof num, "%.17g", value);
    Sample(name, labels, std::string_view(num));
  }
  void Sample(std::string_view name, std::string_view labels, uint64_t value) {
    char num[32];
    std::snprintf(num, sizeof num, "%" PRIu64, value);
    Sample(name, labels, std::string_view(num));
  }
  void Sample(std::string_view name, std::string_view labels, std::string_view value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }

 private:
  std::string& out_;
};

void RenderMethods(Writer& w, std::string_view side, const internal::MethodTable& table,
                   bool with_bytes) {
  // One consistent sum per method, and its label, for every family below.
  struct Row {
    std::string label;
    internal::MethodStats::Totals t;
  };
  std::vector<Row> rows;
  for (const auto* m : table.All()) {
    rows.push_back({"method=\"" + EscapeLabelValue(m->name) + "\"", m->Sum()});
  }
  if (rows.empty()) return;
  const std::string p = "rdmarpc_" + std::string(side) + "_";
  const char* who = side == "server" ? "handled by this server" : "made by this process";

  w.Family(p + "started_total", "counter", std::string("Calls started, ") + who + ".");
  for (const Row& r : rows) w.Sample(p + "started_total", r.label, r.t.started);

  w.Family(p + "handled_total", "counter",
           std::string("Calls finished, by status code, ") + who + ".");
  for (const Row& r : rows) {
    for (size_t c = 0; c < internal::MethodStats::kCodes; ++c) {
      if (r.t.handled[c] == 0) continue;
      w.Sample(p + "handled_total",
               r.label + ",code=\"" + StatusCodeName(static_cast<StatusCode>(c)) + "\"",
               r.t.handled[c]);
    }
  }

  w.Family(p + "in_flight", "gauge", "Calls started and not yet finished.");
  for (const Row& r : rows) {
    // Sum read the handled counts first: the clamp only covers reordering across threads.
    uint64_t finished = 0;
    for (uint64_t h : r.t.handled) finished += h;
    w.Sample(p + "in_flight", r.label,
             static_cast<double>(r.t.started > finished ? r.t.started - finished : 0));
  }

  w.Family(p + "handling_seconds", "histogram",
           "Time from the call's start to its end (server: from the interceptors to the reply; "
           "client: from the call to its result).");
  for (const Row& r : rows) {
    uint64_t cumulative = 0;
    for (size_t b = 0; b < internal::MethodStats::kBucketCount; ++b) {
      cumulative += r.t.latency_buckets[b];
      char le[32];
      if (b + 1 < internal::MethodStats::kBucketCount) {
        std::snprintf(le, sizeof le, "%g", internal::MethodStats::kBuckets[b]);
      } else {
        std::snprintf(le, sizeof le, "+Inf");
      }
      w.Sample(p + "handling_seconds_bucket", r.label + ",le=\"" + le + "\"", cumulative);
    }
    w.Sample(p + "handling_seconds_sum", r.label, static_cast<double>(r.t.latency_nanos) / 1e9);
    // The count is the +Inf bucket's, so that the two agree in every scrape.
    w.Sample(p + "handling_seconds_count", r.label, cumulative);
  }

  if (!with_bytes) return;
  w.Family(p + "received_bytes_total", "counter",
           "Serialized message bytes received: requests and client-stream messages read.");
  for (const Row& r : rows) w.Sample(p + "received_bytes_total", r.label, r.t.bytes_received);
  w.Family(p + "sent_bytes_total", "counter",
           "Serialized message bytes sent: replies and server-stream messages.");
  for (const Row& r : rows) w.Sample(p + "sent_bytes_total", r.label, r.t.bytes_sent);
}

void RenderTransport(Writer& w) {
  using transport::Get;
  using transport::Stat;
  const transport::StatValues v = transport::Snapshot();
  const auto open = [&](Stat opened, Stat closed) {
    return static_cast<double>(Get(v, opened)) - static_cast<double>(Get(v, closed));
  };
  w.Family("rdmarpc_transport_connections", "gauge",
           "Connections open in this process (accepted and connected), by transport.");
  w.Sample("rdmarpc_transport_connections", "transport=\"tcp\"",
           open(Stat::kTcpConnectionsOpened, Stat::kTcpConnectionsClosed));
  w.Sample("rdmarpc_transport_connections", "transport=\"rdma\"",
           open(Stat::kRdmaConnectionsOpened, Stat::kRdmaConnectionsClosed));
  w.Sample("rdmarpc_transport_connections", "transport=\"inproc\"",
           open(Stat::kInprocConnectionsOpened, Stat::kInprocConnectionsClosed));
  w.Family("rdmarpc_transport_connections_opened_total", "counter",
           "Connections opened in this process, by transport.");
  w.Sample("rdmarpc_transport_connections_opened_total", "transport=\"tcp\"",
           Get(v, Stat::kTcpConnectionsOpened));
  w.Sample("rdmarpc_transport_connections_opened_total", "transport=\"rdma\"",
           Get(v, Stat::kRdmaConnectionsOpened));
  w.Sample("rdmarpc_transport_connections_opened_total", "transport=\"inproc\"",
           Get(v, Stat::kInprocConnectionsOpened));

  w.Family("rdmarpc_transport_refused_total", "counter",
           "New connections turned away, by reason: a server connection limit (max_connections, "
           "max_connections_per_peer), twice max_handshakes in set-up at once, or out of "
           "descriptors.");
  w.Sample("rdmarpc_transport_refused_total", "reason=\"connection_limit\"",
           Get(v, Stat::kRefusedLimit));
  w.Sample("rdmarpc_transport_refused_total", "reason=\"handshakes\"",
           Get(v, Stat::kRefusedHandshakes));
  w.Sample("rdmarpc_transport_refused_total", "reason=\"descriptors\"",
           Get(v, Stat::kRefusedDescriptors));
  w.Family("rdmarpc_transport_handshakes_given_up_total", "counter",
           "Connections in set-up given up for newer ones at max_handshakes (clients that "
           "connect and never finish the handshake).");
  w.Sample("rdmarpc_transport_handshakes_given_up_total", "", Get(v, Stat::kHandshakesGivenUp));

  w.Family("rdmarpc_rdma_ring_used_bytes", "gauge",
           "Bytes this process's RDMA connections have written into their peers' receive rings "
           "and not yet had credited back (ring occupancy, summed over connections).");
  w.Sample("rdmarpc_rdma_ring_used_bytes", "",
           open(Stat::kRdmaRingBytesWritten, Stat::kRdmaRingBytesCredited));
  w.Family("rdmarpc_rdma_credit_stalls_total", "counter",
           "Messages that found no ring credit or send-queue room and waited for it.");
  w.Sample("rdmarpc_rdma_credit_stalls_total", "", Get(v, Stat::kRdmaCreditStalls));
  w.Family("rdmarpc_rdma_unregistered_messages_total", "counter",
           "Large messages whose buffer could not be registered (usually the locked-memory "
           "limit, ulimit -l): sent in chunks through the ring instead of by rendezvous, or "
           "received by reading them in pieces through a smaller registered buffer.");
  w.Sample("rdmarpc_rdma_unregistered_messages_total", "direction=\"sent\"",
           Get(v, Stat::kRdmaUnregisteredSent));
  w.Sample("rdmarpc_rdma_unregistered_messages_total", "direction=\"received\"",
           Get(v, Stat::kRdmaUnregisteredReceived));
  w.Family("rdmarpc_rdma_cq_polls_total", "counter", "ibv_poll_cq calls.");
  w.Sample("rdmarpc_rdma_cq_polls_total", "", Get(v, Stat::kRdmaCqPolls));
  w.Family("rdmarpc_rdma_completions_total", "counter", "RDMA work completions taken.");
  w.Sample("rdmarpc_rdma_completions_total", "", Get(v, Stat::kRdmaCompletions));
  w.Family("rdmarpc_rdma_wakeups_total", "counter",
           "Wake-ups from sleeping on a completion channel (completions per wake-up: "
           "rate(rdmarpc_rdma_completions_total) / rate(rdmarpc_rdma_wakeups_total)).");
  w.Sample("rdmarpc_rdma_wakeups_total", "", Get(v, Stat::kRdmaWakeups));
  w.Family("rdmarpc_rdma_poll_seconds_total", "counter",
           "Time I/O threads spent polling completion queues: busy (busy_poll) or spin "
           "(adaptive polling's window).");
  w.Sample("rdmarpc_rdma_poll_seconds_total", "mode=\"busy\"",
           static_cast<double>(Get(v, Stat::kRdmaBusyPollNanos)) / 1e9);
  w.Sample("rdmarpc_rdma_poll_seconds_total", "mode=\"spin\"",
           static_cast<double>(Get(v, Stat::kRdmaSpinNanos)) / 1e9);
  w.Family("rdmarpc_rdma_sleep_seconds_total", "counter",
           "Time I/O threads spent asleep on a completion channel.");
  w.Sample("rdmarpc_rdma_sleep_seconds_total", "",
           static_cast<double>(Get(v, Stat::kRdmaSleepNanos)) / 1e9);
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

Metrics::Metrics() = default;
Metrics::~Metrics() = default;

std::shared_ptr<ServerInterceptor> Metrics::server_interceptor() {
  return std::make_shared<ServerMetricsInterceptor>(shared_from_this());
}

std::shared_ptr<ClientInterceptor> Metrics::client_interceptor() {
  return std::make_shared<ClientMetricsInterceptor>(shared_from_this());
}

void Metrics::Watch(const Server& server) {
  std::lock_guard lock(mu_);
  server_watched_ = &server;
}

void Metrics::AddGauge(std::string name, std::string help, std::function<double()> value,
                       bool counter) {
  std::lock_guard lock(mu_);
  custom_.push_back({std::move(name), std::move(help), std::move(value), counter});
}

std::string Metrics::Render() const {
  std::string out;
  Writer w(out);
  RenderMethods(w, "server", server_, /*with_bytes=*/true);
  RenderMethods(w, "client", client_, /*with_bytes=*/false);
  std::lock_guard lock(mu_);
  if (server_watched_) {
    w.Family("rdmarpc_server_connections", "gauge", "Client connections this server serves.");
    w.Sample("rdmarpc_server_connections", "", static_cast<double>(server_watched_->connections()));
    w.Family("rdmarpc_server_calls_in_flight", "gauge", "Calls this server is handling.");
    w.Sample("rdmarpc_server_calls_in_flight", "",
             static_cast<double>(server_watched_->in_flight_calls()));
    w.Family("rdmarpc_server_throttle_events_total", "counter",
             "Times a connection went over its memory budget, or waited for room for a large "
             "message still arriving, and was paused.");
    w.Sample("rdmarpc_server_throttle_events_total", "",
             static_cast<uint64_t>(server_watched_->throttle_events()));
    w.Family("rdmarpc_server_buffered_bytes", "gauge",
             "Bytes the connections hold together (requests of running calls, replies not yet "
             "taken), against ServerOptions::max_buffered_bytes; to within 32 KiB a connection.");
    w.Sample("rdmarpc_server_buffered_bytes", "",
             static_cast<double>(server_watched_->buffered_bytes()));
    w.Family("rdmarpc_server_receiving_bytes", "gauge",
             "Bytes the connections hold for large messages beyond their usual buffers (while "
             "they arrive, and TCP buffers kept for the next), against "
             "ServerOptions::max_buffered_bytes.");
    w.Sample("rdmarpc_server_receiving_bytes", "",
             static_cast<double>(server_watched_->receiving_bytes()));
    w.Family("rdmarpc_server_stalled_messages_total", "counter",
             "Connections closed because a large message stopped arriving while others waited "
             "for room (ServerOptions::stalled_message_timeout).");
    w.Sample("rdmarpc_server_stalled_messages_total", "",
             static_cast<uint64_t>(server_watched_->stalled_messages()));
  }
  RenderTransport(w);
  for (const Custom& c : custom_) {
    w.Family(c.name, c.counter ? "counter" : "gauge", c.help);
    w.Sample(c.name, "", c.value());
  }
  return out;
}

}  // namespace rdmarpc
