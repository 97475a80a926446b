#include "proxy/data/upstream_table.hpp"

#include <optional>

#include <fmt/format.h>

#include "backends/llama_http_backend.hpp"
#include "core/identity.hpp"
#include "core/log.hpp"
#include "core/request_rewrite.hpp"
#include "proxy/http/http_status.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

namespace {

backends::http_endpoint endpoint_of(const config::server_config& sc) {
  backends::http_endpoint ep;
  config::parse_http_url(sc.upstream.url, ep.host, ep.port, ep.base_path);
  ep.api_key = sc.upstream.api_key;
  return ep;
}

std::unique_ptr<swap_groups> swap_groups_of(
    const std::vector<std::unique_ptr<upstream_entry>>& ups) {
  std::vector<swap_groups::member> members;
  for (const auto& up : ups)
    if (!up->router) members.push_back({up->cfg.name, up->cfg.swap_group, up->coord.get()});
  return std::make_unique<swap_groups>(std::move(members));
}

}  // namespace

coordinator_options options_for(const config::config& cfg, const config::server_config& sc) {
  coordinator_options co;
  co.pool.instance_key = sc.name;
  co.pool.runtime_key = sc.runtime_key;
  co.pool.slot_id = sc.slot_id;
  co.pool.reserve_aux_slot = sc.reserve_aux_slot;
  co.pool.save_on_switch = cfg.checkpoint.on_switch;
  co.pool.save_on_turn_end = cfg.checkpoint.on_turn_end;
  co.pool.save_on_step_end = cfg.checkpoint.on_step_end;
  co.pool.idle_checkpoint = checkpoint_before_sleep(cfg.checkpoint.idle, sc.upstream.sleep_idle);
  co.pool.early_checkpoint = cfg.checkpoint.early;
  co.pool.restore_enabled = cfg.restore.enabled;
  co.pool.verify_restore = cfg.restore.verify;
  co.pool.seed_across_sessions = cfg.sharing != config::sharing_scope::session;
  co.pool.seed_within_credential = cfg.sharing == config::sharing_scope::credential;
  co.pool.strict = cfg.failure.strict;
  co.pool.max_consecutive_failures = cfg.failure.max_consecutive_failures;
  co.pool.cooldown = cfg.failure.cooldown;
  co.max_waiting = cfg.queue.max_waiting;
  // A swap group's member is probed on its requests only: behind a swapper, a background
  // /props would start the model it asks about (docs/design.md §15).
  co.epoch_probe_interval =
      sc.swap_group.empty() ? cfg.epoch_probe_interval : std::chrono::milliseconds{0};
  co.sleep_idle = sc.upstream.sleep_idle;
  const auto mode = config::resolved_mode(sc.mode, sc.slot_id);
  co.slots = mode == config::slot_mode::single_slot     ? proxy::slot_policy::single_slot
             : mode == config::slot_mode::managed_slots ? proxy::slot_policy::pinned
                                                        : proxy::slot_policy::placed;
  co.server_name = sc.name;
  co.endpoint = sc.upstream.url;
  if (sc.snapshots.management == config::snapshot_management::shared_filesystem)
    co.snapshot_dir = sc.snapshots.path;
  co.retention_max_bytes = cfg.retention.max_total_bytes;
  co.retention_max_sessions = cfg.retention.max_sessions;
  co.retention_max_age_days = cfg.retention.max_age_days;
  co.retention_max_sessions_per_credential = cfg.retention.max_sessions_per_credential;
  co.retention_max_bytes_per_credential = cfg.retention.max_bytes_per_credential;
  co.new_sessions_per_minute = cfg.limits.new_sessions_per_minute;
  co.retention_interval = cfg.retention.interval;
  co.file_timeout = cfg.failure.file_timeout;
  return co;
}

upstream_table::upstream_table(net::io_context& ioc, config::config cfg)
    : ioc_(ioc), cfg_(std::move(cfg)) {
  const std::string state_root = config::resolve_state_dir(cfg_);
  for (const auto& sc : config::effective_servers(cfg_))
    ups_.push_back(make_entry(sc, config::server_state_dir(cfg_, sc, state_root), ""));
  swaps_ = swap_groups_of(ups_);
}

upstream_table::~upstream_table() = default;

std::unique_ptr<upstream_entry> upstream_table::make_entry(const config::server_config& sc,
                                                           const std::string& state_dir,
                                                           const std::string& router_model) {
  auto up = std::make_unique<upstream_entry>();
  up->cfg = sc;
  up->router_model = router_model;
  const auto ep = endpoint_of(sc);
  up->pool = std::make_unique<upstream_pool>(ep, sc.upstream.max_idle_connections,
                                             sc.upstream.connect_timeout);
  auto co = options_for(cfg_, sc);
  if (!router_model.empty()) {
    // A router's model: its own snapshot namespace, and no background probe (one that found
    // the model unloaded would say nothing, and none may load it: docs/design.md §15).
    co.pool.instance_key = sc.name;
    co.epoch_probe_interval = std::chrono::milliseconds{0};
  }
  up->coord = std::make_unique<coordinator>(
      ioc_,
      std::make_unique<backends::llama_http_backend>(ep, cfg_.failure.management_timeout,
                                                     router_model),
      manifest_store(state_dir), co);
  up->relay.upstream_idle = sc.upstream.idle_timeout;
  up->relay.client_write = cfg_.limits.client_write_timeout;
  return up;
}

net::awaitable<void> upstream_table::discover_routers() {
  const std::size_t configured = ups_.size();
  for (std::size_t i = 0; i < configured; ++i) {
    auto& front = *ups_[i];
    auto info = co_await backends::read_router(endpoint_of(front.cfg),
                                               cfg_.failure.management_timeout);
    if (!info) {
      log(log_level::debug, "kv.router.unknown",
          {{"server", front.cfg.name}, {"reason", info.err().message}});
      continue;  // not answering yet: the coordinator's own probe says why
    }
    if (info.value()) add_router_models(front, std::move(*info.value()));
  }
}

// One entry per model, named "<server>/<model>": its own coordinator, snapshot namespace and
// state directory (models/<hash of the id>, so an id is never a path).
void upstream_table::add_router_models(upstream_entry& front, backends::router_info info) {
  const std::string state_root = config::resolve_state_dir(cfg_);
  const std::string front_dir = config::server_state_dir(cfg_, front.cfg, state_root);
  std::vector<router_models::member> members;
  for (const auto& m : info.models) {
    auto sc = front.cfg;
    sc.name = front.cfg.name + "/" + m.id;
    sc.swap_group.clear();  // the router decides what runs: router_models, not swap_groups
    const std::string dir = front_dir + "/models/" + core::sha256_hex(m.id).substr(0, 16);
    ups_.push_back(make_entry(sc, dir, m.id));
    ups_.back()->pool = front.pool;  // one router, one set of connections to it
    members.push_back({m.id, m.aliases, ups_.back()->coord.get()});
  }
  log(log_level::info, "kv.router.found",
      {{"server", front.cfg.name}, {"models", std::to_string(members.size())},
       {"max_instances", std::to_string(info.max_instances)}});
  front.router = std::make_unique<router_models>(front.cfg.name, endpoint_of(front.cfg),
                                                 cfg_.failure.management_timeout,
                                                 std::move(info), std::move(members));
  for (std::size_t i = ups_.size() - front.router->size(); i < ups_.size(); ++i)
    ups_[i]->of_router = front.router.get();
}

upstream_entry& upstream_table::route(const http::request<http::string_body>& req) {
  std::optional<std::string> model;  // parsed at most once, only if a route asks for it
  for (const auto& r : cfg_.routes) {
    if (!r.header.empty()) {
      auto it = req.find(r.header);
      if (it == req.end() || it->value() != r.header_value) continue;
    }
    if (!r.model.empty()) {
      if (!model) model = core::request_model(req.body());
      if (*model != r.model) continue;
    }
    if (auto* up = server_named(r.server)) return *up;
  }
  return *ups_.front();
}

core::result<std::string> router_request_model(const http::request<http::string_body>& req) {
  if (req.method() == http::verb::get || req.method() == http::verb::head)
    return core::query_param(req.target(), "model").value_or("");
  if (req.method() != http::verb::post) return std::string();
  auto read = core::read_request_model(req.body());
  if (!read)
    return core::error{core::errc::request_refused, 0,
                       fmt::format("request body: {}; kvpersist cannot tell which of the router's "
                                   "models it names",
                                   read.err().message)};
  return read;
}

core::result<upstream_entry*> upstream_table::model_entry(
    upstream_entry& up, const http::request<http::string_body>& req) {
  if (!up.router) return &up;
  auto model = router_request_model(req);
  if (!model) return model.err();
  const auto* m = model->empty() ? nullptr : up.router->find(model.value());
  if (!m) return &up;
  for (auto& e : ups_)
    if (e->of_router == up.router.get() && e->router_model == m->model) return e.get();
  return &up;
}

upstream_entry* upstream_table::server_named(const std::string& name) {
  for (auto& up : ups_)
    if (up->cfg.name == name) return up.get();
  return nullptr;
}

std::vector<upstream_entry*> upstream_table::managed() {
  std::vector<upstream_entry*> out;
  for (auto& up : ups_)
    if (!up->router) out.push_back(up.get());
  return out;
}

void upstream_table::prepare_request(const upstream_entry& up,
                                     http::request<http::string_body>& req) const {
  for (const auto& name : cfg_.sessions.headers) req.erase(name);
  req.erase(cfg_.sessions.purpose_header);
  for (const auto& name : cfg_.sessions.strip_headers) req.erase(name);
  strip_hop_by_hop(req.base());
  req.erase(http::field::expect);
  req.set(http::field::host, up.pool->host_field());
  const auto& base = up.pool->endpoint().base_path;
  if (!base.empty()) req.target(base + std::string(req.target()));
  req.version(11);
  req.keep_alive(true);
  req.prepare_payload();
}

}  // namespace kvp::proxy
