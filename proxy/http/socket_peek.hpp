#pragma once
// What a connected socket holds right now, found by a non-blocking peek that consumes nothing.

#include <sys/socket.h>

#include <cerrno>

namespace kvp::proxy {

enum class peer_state { silent, has_bytes, hung_up };

// silent: open, nothing to read; has_bytes: the peer sent something (a pipelined request,
// or bytes it should not have); hung_up: EOF or an error such as a reset.
inline peer_state peek_peer(int fd) {
  char c;
  const auto n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return peer_state::has_bytes;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return peer_state::silent;
  return peer_state::hung_up;
}

}  // namespace kvp::proxy
