// Small pieces every listener and background coroutine of the proxy shares.
#pragma once

#include <exception>
#include <memory>
#include <string>

#include "backends/net.hpp"
#include "core/result.hpp"

namespace kvp::proxy {

// A bound, listening acceptor for "host:port" (port 0 picks one; "localhost" is 127.0.0.1).
// Error: the address does not parse or cannot be bound (message names `what` and the address).
core::result<std::unique_ptr<acceptor>> listen_on(net::io_context& ioc, const std::string& host_port,
                                                  std::string_view what);

// "host:port" of a bound acceptor, IPv6 in brackets.
std::string local_address(const acceptor& a);

// Completion handler for co_spawn'ed background coroutines: logs what escaped them
// (a bug) as kv.internal.exception instead of swallowing it (docs/conventions.md §3: no `detached`).
void log_exception(std::exception_ptr e);

}  // namespace kvp::proxy
