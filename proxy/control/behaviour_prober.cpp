// The behavioural fingerprint's probes (docs/design.md §4).
#include "proxy/control/behaviour_prober.hpp"

#include <functional>
#include <utility>

#include "core/log.hpp"
#include "core/runtime_watch.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {

// The behaviour classes in the state directory, each read or written on the file pool.
net::awaitable<core::result<std::vector<core::behaviour_signature>>> read_behaviour_classes(
    slot_actions& actions, manifest_store store, std::string meta_fp) {
  std::function<core::result<std::vector<core::behaviour_signature>>()> read = [store, meta_fp] {
    return core::result<std::vector<core::behaviour_signature>>(store.read_behaviours(meta_fp));
  };
  co_return co_await actions.on_file_pool<std::vector<core::behaviour_signature>>(
      "reading the behaviour classes", std::move(read));
}

net::awaitable<void> write_behaviour_classes(slot_actions& actions, manifest_store store,
                                             std::string meta_fp,
                                             std::vector<core::behaviour_signature> known) {
  std::function<core::result<core::unit>()> write = [store, meta_fp, known] {
    return store.write_behaviours(meta_fp, known);
  };
  const auto w =
      co_await actions.on_file_pool<core::unit>("writing the behaviour classes", std::move(write));
  if (!w) log(log_level::warn, "kv.state.write_failed", {{"reason", w.err().message}});
}

core::error unknown_behaviour(std::string why) {
  return core::error{core::errc::backend_unavailable, 0, std::move(why)};
}

}  // namespace

behaviour_prober::behaviour_prober(behaviour_prober_parts parts, std::string server_name)
    : backend_(parts.backend),
      store_(parts.store),
      actions_(parts.actions),
      server_name_(std::move(server_name)) {}

net::awaitable<core::result<std::string>> behaviour_prober::establish(int slot,
                                                                      std::string meta_fp) {
  auto first = co_await backend_.probe_behaviour(slot);
  if (!first) co_return unknown_behaviour("the probe failed: " + first.err().message);
  auto read_back = co_await read_behaviour_classes(actions_, store_, meta_fp);
  if (!read_back) co_return unknown_behaviour(read_back.err().message);
  const auto judged = core::runtime_watch::judge_first_behaviour(read_back.value(), first.value());
  using action = core::behaviour_judgement::action;
  if (judged.what == action::adopt) co_return judged.class_id;
  if (judged.what == action::suspect) co_return unknown_behaviour(judged.why);
  co_return co_await confirm_new(slot, std::move(meta_fp), std::move(first.value()),
                                 std::move(read_back.value()));
}

net::awaitable<core::result<std::string>> behaviour_prober::confirm_new(
    int slot, std::string meta_fp, core::behaviour_signature first,
    std::vector<core::behaviour_signature> known) {
  for (int i = 0; i < 2; ++i) {  // another model, or noise: two more probes must agree
    auto again = co_await backend_.probe_behaviour(slot);
    if (!again || !core::same_behaviour(first, again.value()))
      co_return unknown_behaviour("probes of one runtime disagree (nondeterministic backend?)");
  }
  known.push_back(first);
  co_await write_behaviour_classes(actions_, store_, meta_fp, known);
  const auto id = core::behaviour_class_id(first);
  if (known.size() > 1) {
    log(log_level::warn, "kv.backend.behaviour_changed",
        {{"server", server_name_}, {"class", id},
         {"code", std::string(core::to_string(core::errc::snapshot_incompatible))},
         {"reason", "the model answers unlike any model seen under this metadata (weights "
                    "replaced at the same path?)"},
         {"effect", "snapshots of the other models are refused, and kept"}});
  } else {
    log(log_level::info, "kv.backend.behaviour", {{"server", server_name_}, {"class", id}});
  }
  co_return id;
}

}  // namespace kvp::proxy
