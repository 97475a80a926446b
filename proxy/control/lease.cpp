#include "proxy/control/lease.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>


namespace kvp::proxy {

using namespace net::experimental::awaitable_operators;

lease& lease::operator=(lease&& o) noexcept {
  if (this != &o) {
    lease dropped(std::move(*this));  // released by its destructor
    c_ = std::exchange(o.c_, nullptr);
    t_ = std::move(o.t_);
    prepared_ = std::move(o.prepared_);
  }
  return *this;
}

lease::~lease() {
  if (c_) c_->spawn(c_->release(t_));
}

lease lease::prepared_in_admission(coordinator& c, std::shared_ptr<lease_ticket> t,
                                  prepare_result pr) {
  lease l;
  if (pr) l.c_ = &c;  // else the coordinator released it: nothing to release
  l.t_ = std::move(t);
  l.prepared_ = std::move(pr);
  return l;
}

net::awaitable<prepare_result> lease::prepare(core::request_identity who, bool fresh_upstream) {
  if (prepared_) co_return *std::exchange(prepared_, std::nullopt);
  prepare_result pr;
  if (t_->exclusive)
    pr = co_await c_->on_strand(c_->prepare_exclusive(t_, fresh_upstream));
  else
    pr = co_await c_->on_strand(c_->prepare(t_, std::move(who), fresh_upstream));
  if (!pr) c_ = nullptr;  // the coordinator released it
  co_return pr;
}

net::awaitable<void> lease::finish(bool reached_slot, bool turn_end,
                                   std::optional<reply_report> reply) {
  auto* c = std::exchange(c_, nullptr);
  if (t_->exclusive)
    co_await c->on_strand(c->finish_exclusive(t_, reached_slot, turn_end, std::move(reply)));
  else
    co_await c->on_strand(c->finish(t_, reached_slot, turn_end, std::move(reply)));
}

void lease::finish_later(bool reached_slot, bool turn_end, std::optional<reply_report> reply) {
  auto* c = std::exchange(c_, nullptr);
  c->spawn(c->finish(t_, reached_slot, turn_end, reply));
}

net::awaitable<void> lease::release() {
  auto* c = std::exchange(c_, nullptr);
  if (c) co_await c->on_strand(c->release(t_));
}

net::awaitable<acquisition> lease::await_admission(coordinator& c,
                                                  std::shared_ptr<lease_ticket> t,
                                                  core::request_identity who, bool pooled,
                                                  std::function<net::awaitable<bool>()> gone,
                                                  std::function<void()> on_wait) {
  const auto adm = co_await c.on_strand(c.admit(t, std::move(who), pooled));
  acquisition out;
  switch (adm.what) {
    case admission::outcome::rejected:
      on_wait();  // the pooled connection goes back as if it had waited
      out.what = acquisition::outcome::rejected;
      co_return out;
    case admission::outcome::runtime_change_pending:
      out.what = acquisition::outcome::runtime_change_pending;
      co_return out;
    case admission::outcome::prepared:
      out.what = acquisition::outcome::granted;
      out.held = lease::prepared_in_admission(c, t, adm.prepared);
      co_return out;
    case admission::outcome::granted:
      out.what = acquisition::outcome::granted;
      out.held = lease(c, t);
      co_return out;
    case admission::outcome::pass_through:
      out.what = acquisition::outcome::pass_through;
      out.held = lease(c, t);
      co_return out;
    case admission::outcome::queued:
      break;
  }
  on_wait();
  auto w = co_await (t->wakeup.async_wait(token) || gone());
  const bool client_left = w.index() == 1;
  const bool granted = co_await c.on_strand(c.settle(t));
  if (granted) out.held = lease(c, t);
  if (client_left) {
    out.what = acquisition::outcome::client_gone;  // a granted lease is released by `held`
  } else {
    out.what = granted ? acquisition::outcome::granted : acquisition::outcome::timed_out;
  }
  co_return out;
}

net::awaitable<acquisition> acquire(coordinator& c, core::request_identity who, bool unpinnable,
                                    bool pooled, std::chrono::milliseconds queue_timeout,
                                    std::function<net::awaitable<bool>()> gone,
                                    std::function<void()> on_wait) {
  auto t = std::make_shared<lease_ticket>(co_await net::this_coro::executor);
  t->who = who;
  t->unpinnable = unpinnable;
  t->wakeup.expires_after(queue_timeout);
  co_return co_await lease::await_admission(c, std::move(t), std::move(who), pooled,
                                            std::move(gone), std::move(on_wait));
}

net::awaitable<acquisition> begin_runtime_change(coordinator& c,
                                                 std::chrono::milliseconds queue_timeout,
                                                 std::function<net::awaitable<bool>()> gone) {
  auto t = std::make_shared<lease_ticket>(co_await net::this_coro::executor);
  t->exclusive = true;
  t->runtime_change = true;
  t->wakeup.expires_after(queue_timeout);
  const core::request_identity nobody;  // a named argument (docs/conventions.md §3)
  auto out = co_await lease::await_admission(c, t, nobody, false, std::move(gone), [] {});
  if (out.what == acquisition::outcome::granted) co_await c.on_strand(c.begin_runtime_change(t));
  co_return out;
}

net::awaitable<void> end_runtime_change(lease l, bool reached_server) {
  auto* c = std::exchange(l.c_, nullptr);
  co_await c->on_strand(c->end_runtime_change(l.t_, reached_server));
}

}  // namespace kvp::proxy
