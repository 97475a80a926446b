// The admin API's gc of the whole server (docs/design.md §18, §12; its flush is checkpoint());
// the session operations are proxy/control/session_admin.hpp.
#include "proxy/control/coordinator.hpp"

namespace kvp::proxy {

net::awaitable<gc_report> coordinator::admin_gc() {
  const auto hold = co_await acquire_internal();
  co_return co_await retention_.run_gc();
}

}  // namespace kvp::proxy
