#include "proxy/control/commit_pipeline.hpp"

#include <utility>

namespace kvp::proxy {

commit_pipeline::handle commit_pipeline::begin(const std::string& hash) {
  auto h = std::make_shared<pending>(ex_);
  h->settled.expires_at(steady_timer::time_point::max());
  commits_[hash] = h;
  return h;
}

void commit_pipeline::settle(const std::string& hash, const handle& h,
                             core::result<core::unit> outcome) {
  h->outcome = std::move(outcome);
  h->done = true;
  h->settled.cancel();
  if (auto it = commits_.find(hash); it != commits_.end() && it->second == h) commits_.erase(it);
}

net::awaitable<core::result<core::unit>> commit_pipeline::await(handle h) {
  while (!h->done) {
    auto [ec] = co_await h->settled.async_wait(token);
    (void)ec;
  }
  co_return h->outcome;
}

net::awaitable<core::result<core::unit>> commit_pipeline::wait(std::string hash) {
  auto it = commits_.find(hash);
  if (it == commits_.end()) co_return core::unit{};
  auto h = it->second;
  co_return co_await await(std::move(h));
}

net::awaitable<void> commit_pipeline::wait_all() {
  while (!commits_.empty()) {
    const auto hash = commits_.begin()->first;
    const auto r = co_await wait(hash);
    (void)r;
  }
}

}  // namespace kvp::proxy
