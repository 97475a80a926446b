#include "proxy/data/upstream_default.hpp"

#include "backends/http_client.hpp"
#include "config/config.hpp"

namespace kvp::proxy {

net::awaitable<std::optional<std::string>> find_default_upstream(std::chrono::milliseconds timeout) {
  for (const auto url : default_upstream_urls) {
    backends::http_endpoint ep;
    config::parse_http_url(std::string(url), ep.host, ep.port, ep.base_path);
    auto r = co_await backends::http_call(ep, http::verb::get, "/health", "", timeout);
    // llama-server answers /health with 200 {"status":"ok"} when ready, 503 while it loads
    if (r && ((r->status == 200 && r->body.find("\"status\"") != std::string::npos) || r->status == 503))
      co_return std::string(url);
  }
  co_return std::nullopt;
}

}  // namespace kvp::proxy
