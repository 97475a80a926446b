// A deterministic, in-memory kv_backend (docs/design.md §19) for coordinator tests: one slot that holds
// a token count, and "files" (name -> token count) standing in for --slot-save-path.
// It answers like llama-server does (docs/llama-server.md §1.3): a failed restore clears the slot,
// a missing file is a 400, saving an empty slot writes a file with n_saved 0.
// Every call is recorded in order, so tests assert the exact management sequence.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "backends/kv_backend.hpp"

namespace kvp::testing {

struct backend_call {
  std::string action;  // "probe", "props" (read_runtime), "inspect", "save", "restore", "erase",
                       // "run" (run_on_slot; filename holds its target)
  int slot = -1;       // -1 for calls that name no slot
  std::string filename;

  bool operator==(const backend_call&) const = default;
};

std::ostream& operator<<(std::ostream& os, const backend_call& c);

// How an injected failure looks: an HTTP status from llama-server, or no answer at all.
struct failure {
  int http_status = 0;  // 0: transport (connection refused, reset, timeout)

  static failure transport() { return failure{0}; }
  static failure http(int status) { return failure{status}; }
};

class FakeBackend final : public backends::kv_backend {
 public:
  // Token counts become byte counts as llama-server's file sizes would: a header plus a
  // fixed size per token.
  static constexpr std::uint64_t header_bytes = 24;
  static constexpr std::uint64_t bytes_per_token = 1024;

  FakeBackend();

  // kv_backend
  net::awaitable<core::result<core::server_probe>> probe() override;
  net::awaitable<core::result<core::runtime_info>> read_runtime() override;
  net::awaitable<core::result<std::vector<backends::slot_info>>> inspect_slots() override;
  net::awaitable<core::result<core::slot_saved>> save(int slot, std::string filename) override;
  net::awaitable<core::result<core::slot_restored>> restore(int slot,
                                                            std::string filename) override;
  net::awaitable<core::result<core::slot_erased>> erase(int slot) override;
  // kvpersist's own request on the slot (a prefix snapshot's cut request): recorded as
  // {"run", slot, target}; afterwards the slot holds what leave_after_run set.
  net::awaitable<core::result<core::unit>> run_on_slot(int slot, std::string target,
                                                       std::string body) override;

  // Controls. A "next" failure applies to the next call of that kind only.
  void fail_next_save(failure f) { fail_save_ = f; }
  void fail_next_restore(failure f) { fail_restore_ = f; }
  void fail_next_erase(failure f) { fail_erase_ = f; }
  void fail_next_run(failure f) { fail_run_ = f; }
  // The next restores/saves complete only after `d` (a steady_timer on the caller's executor).
  void delay_restore(std::chrono::milliseconds d) { restore_delay_ = d; }
  void delay_save(std::chrono::milliseconds d) { save_delay_ = d; }
  // The file disappears from the save directory.
  void remove_snapshot(const std::string& filename) { files_.erase(filename); }
  // The file stays but cannot be loaded: restore answers 400 and clears the slot.
  void corrupt_snapshot(const std::string& filename) { corrupt_.insert(filename); }
  // Puts a file in place as if an earlier process had saved `tokens` into it.
  void put_snapshot(const std::string& filename, std::uint64_t tokens);
  // llama-server without --slot-save-path: probe reports it, slot actions answer 501.
  bool slot_actions_disabled = false;
  void set_runtime(core::runtime_info rt) { runtime_ = std::move(rt); }
  const core::runtime_info& runtime() const { return runtime_; }
  // While set, every call fails at the transport level (the server is down).
  void set_unreachable(bool v) { unreachable_ = v; }
  // While set, the full probe answers HTTP 500 and /props still answers (a proxy in front
  // that refuses /v1/models).
  void set_probe_failing(bool v) { probe_failing_ = v; }
  // A new llama-server process: new media_marker, empty slot, files kept.
  void restart_server();
  // Simulates a request on the slot: afterwards the slot holds `tokens` tokens.
  void run_inference(std::uint64_t tokens) { slot_tokens_ = tokens; }
  // What the slot holds after a run_on_slot (llama-server keeps the common prefix of what it
  // held and the request, and adds the few tokens it evaluates and generates).
  void leave_after_run(std::uint64_t tokens) { run_leaves_ = tokens; }
  // The body of the last run_on_slot.
  const std::string& last_run_body() const { return last_run_body_; }
  // llama-server emptied the slot on its own (--cache-idle-slots): a save then writes 0 tokens.
  void clear_slot() { slot_tokens_ = 0; }

  // Observations.
  const std::vector<backend_call>& calls() const { return calls_; }
  std::vector<backend_call> slot_calls() const;  // save/restore/erase and run only
  static backend_call probe_call() { return {"probe", -1, ""}; }
  static backend_call props_call() { return {"props", -1, ""}; }
  void clear_calls() { calls_.clear(); }
  std::uint64_t slot_tokens() const { return slot_tokens_; }
  std::optional<std::uint64_t> snapshot_tokens(const std::string& filename) const;
  int probes() const;

 private:
  core::error transport_error() const;
  // Why a save, restore or erase fails before it runs, if it does: the server unreachable, slot
  // actions disabled (501), or the failure `next` set by fail_next_* (taken once).
  std::optional<core::error> refused(core::errc code, std::optional<failure>& next,
                                     const char* message);
  net::awaitable<void> sleep(std::chrono::milliseconds d);

  core::runtime_info runtime_;
  int epoch_ = 1;
  std::uint64_t slot_tokens_ = 0;
  std::map<std::string, std::uint64_t> files_;
  std::set<std::string> corrupt_;
  std::optional<failure> fail_save_, fail_restore_, fail_erase_, fail_run_;
  std::uint64_t run_leaves_ = 0;
  std::string last_run_body_;
  std::chrono::milliseconds restore_delay_{0}, save_delay_{0};
  bool unreachable_ = false;
  bool probe_failing_ = false;
  std::vector<backend_call> calls_;
};

// Shorthands for expected call sequences.
inline backend_call save_call(const std::string& file, int slot = 0) {
  return {"save", slot, file};
}
inline backend_call restore_call(const std::string& file, int slot = 0) {
  return {"restore", slot, file};
}
inline backend_call erase_call(int slot = 0) { return {"erase", slot, ""}; }

}  // namespace kvp::testing
