// Keep-alive connections to one llama-server for forwarded requests. A connection is
// checked before reuse (a peer that closed it is discarded) and a new one is reported as
// fresh, which tells the coordinator the server may have restarted.
// Thread safety: acquire/release may be called from any strand (a mutex guards the list).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/http_client.hpp"
#include "backends/net.hpp"
#include "core/result.hpp"

namespace kvp::proxy {

struct upstream_conn {
  std::unique_ptr<tcp_stream> stream;
  bool fresh = false;  // newly connected (not reused from the pool)
};

class upstream_pool {
 public:
  upstream_pool(backends::http_endpoint ep, std::size_t max_idle,
                std::chrono::milliseconds connect_timeout)
      : ep_(std::move(ep)),
        host_field_(backends::host_field(ep_)),
        max_idle_(max_idle),
        connect_timeout_(connect_timeout) {}

  // A connected stream on executor `ex`: an idle pooled one that is still open, else a new
  // connection. Error: backend_unavailable / operation_timeout.
  net::awaitable<core::result<upstream_conn>> acquire(net::any_io_executor ex);
  // An idle pooled connection that is still open, on executor `ex`, or nullptr. Never
  // connects and never suspends.
  std::unique_ptr<tcp_stream> take_idle(const net::any_io_executor& ex);
  // Returns a connection whose last response was read completely and allows keep-alive.
  void release(std::unique_ptr<tcp_stream> s);

  const backends::http_endpoint& endpoint() const { return ep_; }
  // The Host field of every forwarded request, formatted once.
  const std::string& host_field() const { return host_field_; }

 private:
  backends::http_endpoint ep_;
  std::string host_field_;
  std::size_t max_idle_;
  std::chrono::milliseconds connect_timeout_;
  std::mutex mu_;
  std::vector<std::unique_ptr<tcp_stream>> idle_;
};

}  // namespace kvp::proxy
