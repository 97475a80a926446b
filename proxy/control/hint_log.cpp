// Hints (core/request_hints.hpp): counted, told once per process in the log and in the state
// directory for `kvpersist doctor`, and reported for /kv/status and /metrics.
#include "proxy/control/hint_log.hpp"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/log.hpp"
#include "proxy/control/wall_clock.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

hint_log::hint_log(std::string server_name, net::any_io_executor strand,
                   const manifest_store& store, slot_actions& actions)
    : server_name_(std::move(server_name)),
      strand_(std::move(strand)),
      store_(store),
      actions_(actions) {}

void hint_log::note(core::hint_id h) {
  const auto i = static_cast<std::size_t>(h);
  if (seen_[i].fetch_add(1, std::memory_order_relaxed) == 0)
    net::co_spawn(strand_, record_first(h, wall_now()), log_exception);
}

net::awaitable<void> hint_log::record_first(core::hint_id h, std::string seen_at) {
  const auto& text = core::hint_text(h);
  first_seen_at_[static_cast<std::size_t>(h)] = seen_at;
  log(log_level::info, fmt::format("kv.hint.{}", text.id),
      {{"server", server_name_}, {"effect", std::string(text.effect)},
       {"fix", std::string(text.fix)}});
  std::vector<manifest_store::hint_record> seen;
  for (std::size_t i = 0; i < core::hint_count; ++i)
    if (!first_seen_at_[i].empty())
      seen.push_back({static_cast<core::hint_id>(i), first_seen_at_[i]});
  std::function<core::result<core::unit>()> work = [store = store_, seen] {
    return store.write_hints(seen);
  };
  const auto w = co_await actions_.on_file_pool<core::unit>("writing hints.json", std::move(work));
  if (!w) log(log_level::warn, "kv.state.write_failed", {{"reason", w.err().message}});
}

void hint_log::write_status(core::json_writer& w) const {
  w.StartArray();
  for (std::size_t i = 0; i < core::hint_count; ++i) {
    const auto n = seen_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    const auto& text = core::hint_text(static_cast<core::hint_id>(i));
    w.StartObject();
    core::write_json_member(w, "hint", text.id);
    core::write_json_count(w, "requests", n);
    core::write_json_member(w, "firstSeenAt", first_seen_at_[i]);
    core::write_json_member(w, "effect", text.effect);
    core::write_json_member(w, "fix", text.fix);
    w.EndObject();
  }
  w.EndArray();
}

void hint_log::write_metrics(core::prom_writer& w, const std::string& labels) const {
  w.family("kvpersist_hint_requests_total", "counter",
           "Requests that showed something keeping new conversations from starting warm, by "
           "hint (attribution_header: Claude Code's per-conversation system block).");
  for (std::size_t i = 0; i < core::hint_count; ++i)
    w.sample("kvpersist_hint_requests_total",
             fmt::format("{},hint=\"{}\"", labels,
                         core::hint_text(static_cast<core::hint_id>(i)).id),
             static_cast<double>(seen_[i].load(std::memory_order_relaxed)));
}

}  // namespace kvp::proxy
