// Where llama-server listens when nobody said (docs/llama-server.md §13): its default port was
// 8080 and moves to 9931, so kvpersist without `upstream.url` (or --upstream) uses whichever of
// the two answers, and says which.
#pragma once

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "backends/net.hpp"

namespace kvp::proxy {

// llama-server's default addresses, old first: with both answering, the long-standing one.
inline constexpr std::array<std::string_view, 2> default_upstream_urls = {"http://127.0.0.1:8080",
                                                                          "http://127.0.0.1:9931"};

// The first default address whose GET /health answers as llama-server's does (200, or 503
// while the model loads), within `timeout` each; nullopt when none does.
net::awaitable<std::optional<std::string>> find_default_upstream(std::chrono::milliseconds timeout);

}  // namespace kvp::proxy
