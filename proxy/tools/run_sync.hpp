// The command-line tools (proxy/tools/cli.cpp, proxy/tools/doctor.cpp) make one call at a time and own
// no io_context: each call runs here to completion.
#pragma once

#include <boost/asio/use_future.hpp>

#include "backends/net.hpp"

namespace kvp::proxy {

// Runs `aw` to completion on a private io_context and returns its result (an exception it
// lets escape is rethrown here).
template <class T>
T run_sync(net::awaitable<T> aw) {
  net::io_context ioc;
  auto fut = net::co_spawn(ioc, std::move(aw), net::use_future);
  ioc.run();
  return fut.get();
}

}  // namespace kvp::proxy
