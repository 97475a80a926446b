// Carrying out a core::slot_pool plan in unit tests (docs/design.md §6): every planned call
// succeeds (a save writes 100 tokens, a restore loads what the manifest promised), then the
// request's inference runs and ends.
#pragma once

#include <catch2/catch.hpp>

#include <string_view>

#include "core/slot_pool.hpp"

namespace kvp::testing {

inline kvp::core::prepare_kind run_plan(kvp::core::slot_pool& p,
                                        const kvp::core::request_identity& w,
                                        const kvp::core::prepare_plan& plan,
                                        kvp::core::steady_time now, std::string_view wall) {
  using namespace kvp::core;
  REQUIRE_FALSE(plan.fail);
  if (plan.save) {
    auto d = p.outcomes().on_save(*plan.save, slot_saved{100, 4096, 1.0}, now, wall);
    REQUIRE(d.ok());
    p.outcomes().store_manifest(d.value());
  }
  if (plan.restore)
    REQUIRE(p.outcomes()
                .on_restore(*plan.restore, slot_restored{plan.restore->expected_tokens, 4096, 1.0},
                            now, wall)
                .restored);
  if (plan.erase) REQUIRE(p.outcomes().on_erase(plan.slot, slot_erased{0}, now));
  const auto kind = p.outcomes().start_inference(w, plan.slot);
  (void)p.outcomes().end_inference(plan.slot, true, now);
  return kind;
}

}  // namespace kvp::testing
