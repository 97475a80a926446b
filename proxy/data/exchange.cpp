#include "proxy/data/exchange.hpp"

namespace kvp::proxy {

net::awaitable<bool> answer_error(exchange& x, core::error e, std::string_view detail) {
  co_return co_await x.client.send(error_answer(e, x.version, x.keep_alive, detail));
}

}  // namespace kvp::proxy
