// Prefix snapshots (docs/design.md §3, "Prefix snapshots"), the I/O half: notes which seeds
// read much more than they reused (core::prefix_wishes decides), keeps the seeded request
// cut after the shared links (core::cut_after_links), and, when nothing is leased and nobody
// waits, makes the snapshot off the request path: under a slot's lease, a request of the
// session prefix:<last shared link> planned like any other (seeded from the donor), the cut
// request pinned to the slot with one token to generate, then its save, checked like any.
//
// Strand-only: one per coordinator, every call on the coordinator's strand. It takes and
// releases slot leases on the coordinator's lease_queue, like any lease holder.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backends/kv_backend.hpp"
#include "backends/net.hpp"
#include "core/metrics.hpp"
#include "core/prefix_snapshot.hpp"
#include "core/request_class.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/lease_queue.hpp"
#include "proxy/control/slot_actions.hpp"

namespace kvp::proxy {

// The coordinator's parts a prefix snapshot is made with; each must outlive the maker.
struct prefix_maker_parts {
  core::slot_pool& pool;
  lease_queue& leases;
  slot_actions& actions;
  backends::kv_backend& backend;
};

// What the first reply after a seed said, and the request it answered.
struct seed_reply {
  core::prepare_kind kind = core::prepare_kind::none;
  std::int64_t reused = -1;  // timings.cache_n; -1: not reported
  std::shared_ptr<const std::string> body;  // the request as forwarded
  std::string target;                       // its route, as the client sent it
};

class prefix_maker {
 public:
  prefix_maker(net::any_io_executor strand, prefix_maker_parts parts);

  // The plan just carried out on `slot` for `who`: a seed is remembered until its reply.
  void note_plan(int slot, const core::prepare_plan& plan, const core::request_identity& who);
  // The reply of the request on `slot`, when it read one.
  void note_reply(int slot, const seed_reply& reply);
  // The prefix snapshots already on disk are not asked for again.
  void note_manifests(const std::vector<core::manifest>& manifests);
  // Starts making the oldest wish when nothing is leased or waiting and a slot's owner is
  // saved. Called whenever a lease is released.
  void arm();
  void stop() { stopped_ = true; }
  void write_metrics(core::prom_writer& w, const std::string& labels) const;

 private:
  struct seed_note {
    std::string donor;
    std::size_t donor_links = 0;
    std::uint64_t donor_tokens = 0;
    std::size_t common = 0;
    std::vector<core::chain_link> chain;
    std::string credential;
  };
  struct cut_request {
    std::string target;
    std::string body;
  };
  // Nothing leased, waiting or passing through, persistence on, not stopped.
  bool quiet() const;
  int free_clean_slot() const;
  net::awaitable<void> make();
  // Under the slot's lease: the plan, the cut request and the save; whether it was saved.
  net::awaitable<bool> make_on(int slot, const core::prefix_wish& w, const cut_request& cut);

  net::any_io_executor strand_;
  core::slot_pool& pool_;
  lease_queue& leases_;
  slot_actions& actions_;
  backends::kv_backend& backend_;
  core::prefix_wishes wishes_;
  std::map<int, seed_note> seeds_;            // by slot, until the seed's first reply
  std::map<std::string, cut_request> cuts_;  // by wish key (credential;link), at most the wishes
  bool running_ = false;
  bool stopped_ = false;
  std::uint64_t made_ = 0, failed_ = 0;
};

}  // namespace kvp::proxy
