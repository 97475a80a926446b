// The admin API's operations on the whole server, flush and gc (docs/design.md §18, §10, §12);
// the session operations are proxy/control/session_admin.hpp.
#include "proxy/control/coordinator.hpp"

namespace kvp::proxy {

net::awaitable<gc_report> coordinator::admin_gc() {
  const auto hold = co_await acquire_internal();
  co_return co_await retention_.run_gc();
}

net::awaitable<admin_outcome> coordinator::admin_flush() {
  const auto saved = co_await checkpoint();
  co_return admin_outcome{saved ? admin_result::flushed : admin_result::save_failed};
}

}  // namespace kvp::proxy
