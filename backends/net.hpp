// Namespace and type aliases for Asio/Beast, declared once (docs/conventions.md §3). Errors come back
// as values: the default completion token is as_tuple(use_awaitable).
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

namespace kvp {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

// Completion token for every awaited operation: returns (error_code, results...) tuples.
using token_t = net::as_tuple_t<net::use_awaitable_t<>>;
inline constexpr token_t token{};

// A TCP stream whose operations default to `token`.
using tcp_stream = token_t::as_default_on_t<beast::tcp_stream>;
using acceptor = token_t::as_default_on_t<tcp::acceptor>;
using steady_timer = token_t::as_default_on_t<net::steady_timer>;
using resolver = token_t::as_default_on_t<tcp::resolver>;

}  // namespace kvp
