#include "tests/support/fake_backend.hpp"

#include <fmt/format.h>

#include <utility>

#include "tests/support/runtime.hpp"

namespace kvp::testing {

namespace {

constexpr const char* restore_error =
    "Unable to restore slot: No available space in KV cache or invalid slot save file";
constexpr const char* disabled_error =
    "This server does not support slots action. Start it with `--slot-save-path`";

}  // namespace

std::ostream& operator<<(std::ostream& os, const backend_call& c) {
  os << c.action;
  if (c.slot >= 0) os << '(' << c.slot << (c.filename.empty() ? "" : ", ") << c.filename << ')';
  return os;
}

FakeBackend::FakeBackend() : runtime_(qwen7b_runtime()) {}

core::error FakeBackend::transport_error() const {
  return core::error{core::errc::backend_unavailable, 0, "connect: Connection refused"};
}

std::optional<core::error> FakeBackend::refused(core::errc code, std::optional<failure>& next,
                                                const char* message) {
  if (unreachable_) return transport_error();
  if (slot_actions_disabled) return core::error{code, 501, disabled_error};
  if (auto f = std::exchange(next, std::nullopt)) {
    if (f->http_status == 0) return transport_error();
    return core::error{code, f->http_status, message};
  }
  return std::nullopt;
}

net::awaitable<void> FakeBackend::sleep(std::chrono::milliseconds d) {
  if (d.count() <= 0) co_return;
  steady_timer t(co_await net::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait();
}

void FakeBackend::put_snapshot(const std::string& filename, std::uint64_t tokens) {
  files_[filename] = tokens;
  corrupt_.erase(filename);
}

void FakeBackend::restart_server() {
  ++epoch_;
  runtime_.media_marker = fmt::format("<__media_{}__>", epoch_);
  slot_tokens_ = 0;
}

std::vector<backend_call> FakeBackend::slot_calls() const {
  std::vector<backend_call> out;
  for (const auto& c : calls_)
    if (c.action == "save" || c.action == "restore" || c.action == "erase" || c.action == "run")
      out.push_back(c);
  return out;
}

std::optional<std::uint64_t> FakeBackend::snapshot_tokens(const std::string& filename) const {
  auto it = files_.find(filename);
  if (it == files_.end()) return std::nullopt;
  return it->second;
}

int FakeBackend::probes() const {
  int n = 0;
  for (const auto& c : calls_) n += c.action == "probe";
  return n;
}

net::awaitable<core::result<core::server_probe>> FakeBackend::probe() {
  calls_.push_back({"probe", -1, ""});
  if (unreachable_) co_return transport_error();
  if (probe_failing_) co_return core::error{core::errc::backend_unavailable, 500, "probe refused"};
  core::server_probe p;
  p.runtime = runtime_;
  p.slot_actions = !slot_actions_disabled;
  co_return p;
}

net::awaitable<core::result<core::runtime_info>> FakeBackend::read_runtime() {
  calls_.push_back({"props", -1, ""});
  if (unreachable_) co_return transport_error();
  co_return runtime_;
}

net::awaitable<core::result<std::vector<backends::slot_info>>> FakeBackend::inspect_slots() {
  calls_.push_back({"inspect", -1, ""});
  if (unreachable_) co_return transport_error();
  backends::slot_info s;
  s.id = 0;
  s.n_ctx = runtime_.n_ctx;
  s.n_prompt_tokens = static_cast<std::int64_t>(slot_tokens_);
  co_return std::vector<backends::slot_info>{s};
}

net::awaitable<core::result<core::slot_saved>> FakeBackend::save(int slot, std::string filename) {
  calls_.push_back({"save", slot, filename});
  co_await sleep(save_delay_);
  if (auto e = refused(core::errc::save_failed, fail_save_, "Unable to save slot")) co_return *e;
  files_[filename] = slot_tokens_;
  corrupt_.erase(filename);
  co_return core::slot_saved{slot_tokens_, header_bytes + slot_tokens_ * bytes_per_token, 1.25};
}

net::awaitable<core::result<core::slot_restored>> FakeBackend::restore(int slot,
                                                                       std::string filename) {
  calls_.push_back({"restore", slot, filename});
  co_await sleep(restore_delay_);
  if (auto e = refused(core::errc::restore_failed, fail_restore_, restore_error)) {
    if (e->http_status >= 400 && e->http_status < 500) slot_tokens_ = 0;
    co_return *e;
  }
  auto it = files_.find(filename);
  if (it == files_.end() || corrupt_.count(filename)) {
    slot_tokens_ = 0;  // llama-server clears the slot on every failed restore
    co_return core::error{core::errc::restore_failed, 400, restore_error};
  }
  slot_tokens_ = it->second;
  co_return core::slot_restored{it->second, header_bytes + it->second * bytes_per_token, 0.75};
}

net::awaitable<core::result<core::slot_erased>> FakeBackend::erase(int slot) {
  calls_.push_back({"erase", slot, ""});
  if (auto e = refused(core::errc::erase_failed, fail_erase_, "erase failed")) co_return *e;
  const auto n = slot_tokens_;
  slot_tokens_ = 0;
  co_return core::slot_erased{n};
}

net::awaitable<core::result<core::unit>> FakeBackend::run_on_slot(int slot, std::string target,
                                                                 std::string body) {
  calls_.push_back({"run", slot, std::move(target)});
  last_run_body_ = std::move(body);
  if (auto e = refused(core::errc::backend_unavailable, fail_run_, "inference failed")) co_return *e;
  slot_tokens_ = run_leaves_;
  co_return core::unit{};
}

}  // namespace kvp::testing
