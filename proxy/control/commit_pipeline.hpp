// The saves whose commit is in flight (docs/design.md §11), by session hash: the snapshot is
// written, not yet durable and named by the manifest. A save's second half runs on the file
// pool while the slot serves its next session; planning for that session, a second save of it,
// and whatever needs every save landed (flush, a runtime change, shutdown) wait for it here.
// The coordinator's slot_actions start and settle each commit (proxy/control/slot_actions.cpp);
// this type only keeps them and wakes their waiters. Strand-only: one per coordinator, used on
// its strand, whose executor the commits' timers run on.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "backends/net.hpp"
#include "core/result.hpp"

namespace kvp::proxy {

class commit_pipeline {
  struct pending;

 public:
  // One commit in flight: what awaits its outcome holds it.
  using handle = std::shared_ptr<pending>;

  explicit commit_pipeline(net::any_io_executor ex) : ex_(std::move(ex)) {}

  // A save of `hash` was written: its commit is in flight until settle. A later one of the
  // same session becomes the one its waiters wait for (start_save waits for the earlier first).
  handle begin(const std::string& hash);
  // The commit ended with `outcome`: its waiters wake, and `hash` has none in flight (unless
  // a later commit of it began meanwhile).
  void settle(const std::string& hash, const handle& h, core::result<core::unit> outcome);

  bool in_flight(const std::string& hash) const { return commits_.contains(hash); }
  bool empty() const { return commits_.empty(); }

  // The commit's outcome, once settled.
  static net::awaitable<core::result<core::unit>> await(handle h);
  // The outcome of the commit of `hash` in flight; success when there is none.
  net::awaitable<core::result<core::unit>> wait(std::string hash);
  // Returns when no commit is in flight.
  net::awaitable<void> wait_all();

 private:
  struct pending {
    explicit pending(net::any_io_executor ex) : settled(std::move(ex)) {}
    steady_timer settled;  // cancelled when the commit is done
    bool done = false;
    core::result<core::unit> outcome = core::unit{};
  };
  net::any_io_executor ex_;
  std::map<std::string, handle> commits_;
};

}  // namespace kvp::proxy
