// One listening port with a connection cap: the proxy's and the admin API's accept loop
// (docs/design.md §17, "Connections and descriptors"). It keeps at most `max_connections`
// client connections open, runs `serve` for each, and never spins: when accept fails (EMFILE,
// ENFILE) it backs off 50 ms doubling to 1 s, as Go's net/http Server.Serve does.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "backends/net.hpp"

namespace kvp::proxy {

// What a listener does with a client that arrives while `max_connections` are open.
enum class when_full {
  wait,    // stop accepting until one closes: the client waits in the kernel's listen backlog
  refuse,  // accept it, write `refusal` (a complete HTTP response), close at once
};

struct listener_options {
  std::string name;                 // "proxy" | "admin": log events kv.<name>.connections_full, _accept_failed
  std::string cap_setting;          // the setting the cap comes from, named in the log
  std::size_t max_connections = 1;  // >= 1
  when_full at_cap = when_full::wait;
  std::string refusal;  // when_full::refuse: the bytes a refused client gets (fits a socket buffer)
};

class listener {
 public:
  // Serves one client connection to its end; the listener counts it open until it returns.
  using serve_fn = std::function<net::awaitable<void>(tcp_stream)>;

  // `bound`: a listening acceptor (listen_on). Accepting starts with start().
  listener(net::io_context& ioc, std::unique_ptr<acceptor> bound, listener_options opts,
           serve_fn serve);

  // Starts the accept loop. Call once.
  void start();
  // Stops accepting and closes the port; connections already open run on. Any thread.
  // REQUIRES: the listener outlives the io_context's handlers (it is stopped, not destroyed,
  // while the io_context runs).
  void stop();

  std::size_t open_connections() const { return open_.load(); }

 private:
  net::awaitable<void> accept_loop();
  // Writes the refusal to a client accepted over the cap and closes it; never blocks.
  void refuse(tcp::socket& sock) const;
  // A served connection ended: below the cap again, a paused accept loop resumes.
  void connection_closed();

  net::io_context& ioc_;
  listener_options opts_;
  serve_fn serve_;
  // The accept loop, stop() and the wake-ups run on strand_.
  net::strand<net::io_context::executor_type> strand_;
  std::unique_ptr<acceptor> acceptor_;
  steady_timer gate_;     // the loop paused at the cap (when_full::wait) waits on it
  steady_timer backoff_;  // the pause after a failed accept
  bool stopped_ = false;  // on strand_
  std::atomic<std::size_t> open_{0};
};

}  // namespace kvp::proxy
