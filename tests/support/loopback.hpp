// Real sockets on 127.0.0.1 for tests of what needs one (a peek for a hang-up, a watcher on
// a socket, a relay between two connections): a connected pair, and a non-blocking reader of
// what a peer has received so far.
#pragma once

#include <string>

#include "backends/net.hpp"

namespace kvp::testing {

// What a peer socket has received, and whether the other side closed the connection.
struct received {
  std::string bytes;
  bool closed = false;

  // Reads what has arrived on `sock` (non-blocking) without waiting for more.
  void read_from(tcp::socket& sock) {
    char buf[4096];
    for (;;) {
      boost::system::error_code ec;
      const auto n = sock.read_some(net::buffer(buf), ec);
      if (ec == net::error::would_block || ec == net::error::try_again) return;
      if (ec) {
        closed = true;
        return;
      }
      bytes.append(buf, n);
    }
  }
};

// A connected pair: `ours` is kvpersist's end, a tcp_stream on `ioc`; `peer` is the other
// side, non-blocking, on its own io_context (a client, or llama-server).
struct loopback_pair {
  explicit loopback_pair(net::io_context& ioc) : ours(ioc) {
    tcp::acceptor acc(peer_ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
    peer.connect(acc.local_endpoint());
    ours.socket().assign(tcp::v4(), acc.accept().release());
    peer.non_blocking(true);
  }
  void send(const std::string& bytes) { net::write(peer, net::buffer(bytes)); }
  // What the peer has received so far.
  const received& peer_received() {
    got.read_from(peer);
    return got;
  }

  net::io_context peer_ioc;
  tcp::socket peer{peer_ioc};
  tcp_stream ours;
  received got;
};

}  // namespace kvp::testing
