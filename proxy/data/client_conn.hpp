// One client connection of the proxy port as the data plane serves it: its stream and read
// buffer, the conversation id it holds while kvpersist has its request (stream_directory.hpp),
// how kvpersist answers it, and how kvpersist learns that its client left.
// Threads: used from the connection's own strand, except `busy` (the server's mutex).
#pragma once

#include <chrono>

#include "backends/net.hpp"
#include "proxy/data/stream_directory.hpp"
#include "proxy/http/http_status.hpp"

namespace kvp::proxy {

struct client_conn {
  // `write_limit`: each write to the client (limits.clientWriteTimeoutMs).
  client_conn(tcp_stream s, std::chrono::milliseconds write_limit);

  // Writes `res`. Returns whether the connection may read another request: `res` keeps it
  // alive and the write succeeded within the write timeout.
  net::awaitable<bool> send(response res);

  // The client hung up (EOF or reset), by a peek that consumes nothing.
  bool hung_up();
  // Completes (true) when the client hangs up while its request waits on something else.
  // Consumes no bytes: a pipelined next request is left in the socket, and then it waits
  // until it is cancelled.
  net::awaitable<bool> gone();
  // The request nobody waits for any more: its client hung up, or, for a conversation request
  // kvpersist holds (which outlives its client, as in llama-server), a stop named its id.
  bool abandoned();
  // Completes (true) when the request becomes abandoned while it waits (for the slot's lease).
  net::awaitable<bool> departed();

  tcp_stream stream;
  beast::flat_buffer buf;
  // The request in hand's conversation id while kvpersist holds it.
  stream_hold pending;
  bool busy = false;  // between a request's header and its answer; guarded by the server's mutex
  const std::chrono::milliseconds write_timeout;
};

}  // namespace kvp::proxy
