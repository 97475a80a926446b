#include "proxy/tools/cli.hpp"

#include <cstdlib>
#include <optional>

#include <fmt/format.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "backends/http_client.hpp"
#include "config/load_yaml.hpp"
#include "core/json.hpp"
#include "core/request_class.hpp"
#include "proxy/tools/run_sync.hpp"
#include "proxy/tools/args.hpp"

namespace kvp::proxy {

namespace {

struct cli_options {
  std::string admin;  // host:port
  std::string token;
  std::string server;  // ?server=NAME for session operations
  bool json = false;
  std::vector<std::string> positional;
  std::optional<config::config> cfg;
};

// Parses the flags shared by the admin commands. Returns an exit code on error.
std::optional<int> parse_common(const std::vector<std::string>& args, cli_options& o) {
  std::string config_path;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    auto need = [&](std::string& out) { return take_value(args, i, out); };
    if (a == "--json") {
      o.json = true;
    } else if (a == "--admin") {
      if (!need(o.admin)) return fmt::print(stderr, "kvpersist: --admin needs HOST:PORT\n"), 2;
    } else if (a == "--server") {
      if (!need(o.server)) return fmt::print(stderr, "kvpersist: --server needs a name\n"), 2;
    } else if (a == "--token") {
      if (!need(o.token)) return fmt::print(stderr, "kvpersist: --token needs a value\n"), 2;
    } else if (a == "--config") {
      if (!need(config_path)) return fmt::print(stderr, "kvpersist: --config needs a file\n"), 2;
    } else if (a.starts_with("--")) {
      fmt::print(stderr, "kvpersist: unknown option '{}' (see --help)\n", a);
      return 2;
    } else {
      o.positional.push_back(a);
    }
  }
  if (!config_path.empty()) {
    auto loaded = config::load_yaml_file(config_path);
    if (auto* err = std::get_if<config::config_error>(&loaded)) {
      fmt::print(stderr, "kvpersist: {}\n", err->to_string());
      return 2;
    }
    o.cfg = std::get<config::config>(std::move(loaded));
  }
  if (o.admin.empty()) o.admin = o.cfg ? o.cfg->admin.listen : "127.0.0.1:8082";
  if (o.token.empty()) {
    if (const char* t = std::getenv("KVP_ADMIN_TOKEN"); t && *t) o.token = t;
    else if (o.cfg) o.token = o.cfg->admin.token;
  }
  return std::nullopt;
}

std::string url_escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

std::string s_of(const rapidjson::Value& v, const char* k) {
  auto it = v.FindMember(k);
  if (it == v.MemberEnd()) return "";
  if (it->value.IsString()) return it->value.GetString();
  if (it->value.IsNull()) return "-";
  if (it->value.IsBool()) return it->value.GetBool() ? "yes" : "no";
  if (it->value.IsUint64()) return std::to_string(it->value.GetUint64());
  if (it->value.IsNumber()) return fmt::format("{:.1f}", it->value.GetDouble());
  return "";
}

double n_of(const rapidjson::Value& v, const char* k) {
  auto it = v.FindMember(k);
  return it != v.MemberEnd() && it->value.IsNumber() ? it->value.GetDouble() : 0;
}

// README "Harnesses": what keeps new conversations from starting warm, and its fix.
void print_hints(const rapidjson::Value& server) {
  const auto it = server.FindMember("hints");
  if (it == server.MemberEnd() || !it->value.IsArray()) return;
  for (const auto& h : it->value.GetArray())
    if (h.IsObject())
      fmt::print("  hint {}: {} ({} requests); fix: {}\n", s_of(h, "hint"), s_of(h, "effect"),
                 s_of(h, "requests"), s_of(h, "fix"));
}

void print_status(const rapidjson::Document& d) {
  fmt::print("kvpersist {}\n", s_of(d, "version"));
  for (const auto& s : d["servers"].GetArray()) {
    const auto& b = s["backend"];
    fmt::print("server {}  {} at {}: {}{}\n", s_of(s, "name"), s_of(b, "kind"),
               s_of(b, "endpoint"), s_of(b, "state"),
               s["enabled"].GetBool() ? "" : " (persistence off)");
    fmt::print("  model {}  build {}  mode {}\n", s_of(b, "model"), s_of(b, "build"), s_of(s, "mode"));
    for (const auto& sl : s["slots"].GetArray())
      fmt::print("  slot {}  owner {}  state {}{}\n", s_of(sl, "id"), s_of(sl, "owner"),
                 s_of(sl, "state"), sl["leased"].GetBool() ? "  (in use)" : "");
    fmt::print("  queue {} waiting\n", s_of(s["queue"], "waiting"));
    const auto& sn = s["snapshots"];
    fmt::print("  snapshots {} known, {} valid, {} invalid ({})\n", s_of(sn, "known"),
               s_of(sn, "valid"), s_of(sn, "invalid"), human_bytes(n_of(sn, "bytes")));
    const auto& st = s["stats"];
    fmt::print("  restores {} (hits {}, failures {}), saves {} (failures {}, empty {}), cold starts {}\n",
               s_of(st, "restores"), s_of(st, "restoreHits"), s_of(st, "restoreFailures"),
               s_of(st, "saves"), s_of(st, "saveFailures"), s_of(st, "emptySaves"),
               s_of(st, "coldStarts"));
    fmt::print("  reused {} prompt tokens after restores, about {:.1f} s of prefill saved\n",
               s_of(st, "reusedTokens"), n_of(st, "prefillSecondsSaved"));
    print_hints(s);
  }
}

void print_sessions(const rapidjson::Document& d) {
  fmt::print("{:<28} {:<8} {:<8} {:>9} {:>10} {:<8} {}\n", "SESSION", "HASH", "STATE", "TOKENS",
             "SIZE", "RESIDENT", "UPDATED");
  for (const auto& s : d["sessions"].GetArray()) {
    std::string id = s_of(s, "sessionId");
    // Terminal safety: ids are the harness's bytes; show printable ASCII only.
    for (auto& c : id)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    if (id.size() > 28) id = id.substr(0, 25) + "...";
    const auto& sn = s["snapshot"];
    std::string state = "none", tokens = "-", size = "-", updated = "-";
    if (sn.IsObject()) {
      state = s_of(sn, "state");
      tokens = s_of(sn, "tokens");
      size = human_bytes(n_of(sn, "bytes"));
      updated = s_of(sn, "updatedAt");
    }
    std::string resident = s["resident"].GetBool() ? (s["dirty"].GetBool() ? "dirty" : "clean") : "-";
    fmt::print("{:<28} {:<8} {:<8} {:>9} {:>10} {:<8} {}\n", id, s_of(s, "sessionHash").substr(0, 8),
               state, tokens, size, resident, updated);
  }
}

// `list`: GET /kv/sessions page by page, following `next`, merged into one document (the
// first page's, with every page's sessions). A failed page is returned as it came.
core::result<backends::http_reply> list_all_sessions(const backends::http_endpoint& ep,
                                                     const std::string& path,
                                                     const std::string& server_query) {
  rapidjson::Document all;
  std::string after;
  for (;;) {
    std::string query = server_query;
    if (!after.empty()) query += (query.empty() ? "after=" : "&after=") + after;
    const std::string target = query.empty() ? path : path + "?" + query;
    auto r = run_sync(backends::http_call(ep, http::verb::get, target, "", std::chrono::minutes(10)));
    if (!r || r->status != 200) return r;
    rapidjson::Document page(&all.GetAllocator());
    page.Parse(r->body.c_str());
    if (page.HasParseError() || !page.IsObject() || !page.HasMember("sessions") ||
        !page["sessions"].IsArray())
      return r;
    std::string next = s_of(page, "next");
    if (all.IsNull()) {
      all.CopyFrom(page, all.GetAllocator());
      all.RemoveMember("next");
    } else {
      for (auto& s : page["sessions"].GetArray()) all["sessions"].PushBack(s, all.GetAllocator());
    }
    // Hashes only grow page to page; anything else would loop.
    if (next.empty() || next <= after) {
      rapidjson::StringBuffer sb;
      rapidjson::Writer<rapidjson::StringBuffer> w(sb);
      all.Accept(w);
      r->body = sb.GetString();
      return r;
    }
    after = std::move(next);
  }
}

}  // namespace

int run_admin_command(const std::string& command, const std::vector<std::string>& args) {
  cli_options o;
  if (auto rc = parse_common(args, o)) return *rc;
  const bool needs_session = command == "save" || command == "restore" ||
                             command == "invalidate" || command == "purge" ||
                             command == "dispose";
  if (needs_session != (o.positional.size() == 1) || o.positional.size() > 1) {
    fmt::print(stderr, "kvpersist: usage: kvpersist {}{} [--admin HOST:PORT] [--token T] [--json]\n",
               command, needs_session ? " SESSION" : "");
    return 2;
  }
  backends::http_endpoint ep;
  if (!config::parse_host_port(o.admin, ep.host, ep.port)) {
    fmt::print(stderr, "kvpersist: --admin '{}' is not HOST:PORT\n", o.admin);
    return 2;
  }
  if (ep.host.starts_with("[")) ep.host = ep.host.substr(1, ep.host.size() - 2);
  ep.api_key = o.token;
  http::verb verb = http::verb::post;
  std::string target;
  const std::string sid = needs_session ? url_escape(o.positional[0]) : "";
  if (command == "status") verb = http::verb::get, target = "/kv/status";
  else if (command == "list") verb = http::verb::get, target = "/kv/sessions";
  else if (command == "flush") target = "/kv/flush";
  else if (command == "gc") target = "/kv/gc";
  else if (command == "purge") verb = http::verb::delete_, target = "/kv/sessions/" + sid;
  else target = fmt::format("/kv/sessions/{}/{}", sid, command);
  const std::string server_query = o.server.empty() ? "" : "server=" + url_escape(o.server);
  auto r = command == "list"
               ? list_all_sessions(ep, target, server_query)
               : run_sync(backends::http_call(ep, verb,
                                              server_query.empty() ? target : target + "?" + server_query,
                                              "", std::chrono::minutes(10)));
  if (!r) {
    fmt::print(stderr, "kvpersist: cannot reach the admin API at {}: {}\n"
                       "  is `kvpersist serve` running? (--admin HOST:PORT or admin.listen)\n",
               o.admin, r.err().message);
    return 3;
  }
  if (r->status == 401) {
    fmt::print(stderr, "kvpersist: the admin API refused the token (401): pass --token or set KVP_ADMIN_TOKEN\n");
    return 1;
  }
  rapidjson::Document d;
  if (o.json || !core::parse_json_bounded(r->body, d)) {
    fmt::print("{}\n", r->body);
  } else if (r->status >= 400) {
    const auto& e = d.HasMember("error") ? d["error"] : d;
    fmt::print(stderr, "kvpersist: {} failed ({}): {}\n", command, r->status, s_of(e, "message"));
  } else if (command == "status") {
    print_status(d);
  } else if (command == "list") {
    print_sessions(d);
  } else {
    std::string line;
    for (auto it = d.MemberBegin(); it != d.MemberEnd(); ++it)
      line += fmt::format("{}{}={}", line.empty() ? "" : "  ", it->name.GetString(),
                          s_of(d, it->name.GetString()));
    fmt::print("{}: {}\n", command, line);
  }
  return r->status >= 400 ? 1 : 0;
}

}  // namespace kvp::proxy
