// Hints (core/request_hints.hpp): what requests show that keeps new conversations from
// starting warm, told once per process in the log, in the state directory for `kvpersist
// doctor`, and counted for /kv/status and /metrics (proxy/control/coordinator_reports.cpp).
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/log.hpp"
#include "proxy/control/coordinator.hpp"
#include "proxy/control/coordinator_internal.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

void coordinator::note_hint(core::hint_id h) {
  const auto i = static_cast<std::size_t>(h);
  if (hints_seen_[i].fetch_add(1, std::memory_order_relaxed) == 0)
    spawn(record_hint(h, detail::wall_now()));
}

net::awaitable<void> coordinator::record_hint(core::hint_id h, std::string seen_at) {
  const auto& text = core::hint_text(h);
  hint_first_seen_[static_cast<std::size_t>(h)] = seen_at;
  log(log_level::info, fmt::format("kv.hint.{}", text.id),
      {{"server", opts_.server_name}, {"effect", std::string(text.effect)},
       {"fix", std::string(text.fix)}});
  std::vector<manifest_store::hint_record> seen;
  for (std::size_t i = 0; i < core::hint_count; ++i)
    if (!hint_first_seen_[i].empty())
      seen.push_back({static_cast<core::hint_id>(i), hint_first_seen_[i]});
  std::function<core::result<core::unit>()> work = [store = store_, seen] {
    return store.write_hints(seen);
  };
  const auto w = co_await actions_.on_file_pool<core::unit>("writing hints.json", std::move(work));
  if (!w) log(log_level::warn, "kv.state.write_failed", {{"reason", w.err().message}});
}

}  // namespace kvp::proxy
