// Tests for config/secrets.hpp: key files, their modes, the environment and systemd
// credentials as sources of llama-server's API key and the admin token.
#include "config/secrets.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "tests/support/temp_dir.hpp"

namespace secrets_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::config;
using kvp::testing::temp_dir;

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// Writes `bytes` to `dir`/`name` with `mode`; returns the path.
std::string write_file(const temp_dir& dir, const std::string& name, const std::string& bytes,
                       mode_t mode = 0600) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  REQUIRE(::chmod(path.c_str(), mode) == 0);
  return path;
}

server_config named_server(std::string name) {
  server_config sv;
  sv.name = std::move(name);
  return sv;
}

}  // namespace

TEST_CASE("a key file loses its trailing line breaks and nothing else", "[config][secrets]") {
  temp_dir dir;
  CHECK(read_secret_file(write_file(dir, "a", "k3y\n")).value == "k3y");
  CHECK(read_secret_file(write_file(dir, "b", "k3y\r\n\n")).value == "k3y");
  CHECK(read_secret_file(write_file(dir, "c", " k 3\ty")).value == " k 3\ty");
  const auto longest = std::string(max_secret_bytes, 'x');
  CHECK(read_secret_file(write_file(dir, "d", longest + "\n")).value == longest);
}

TEST_CASE("a key file that cannot be a key is refused with its path", "[config][secrets]") {
  temp_dir dir;
  SECTION("missing") {
    const auto r = read_secret_file(dir.path() + "/nope");
    CHECK(r.value.empty());
    CHECK(contains(r.error, "cannot read " + dir.path() + "/nope: No such file"));
  }
  SECTION("a directory") {
    CHECK(contains(read_secret_file(dir.path()).error, "is not a regular file"));
  }
  SECTION("a FIFO is refused, not waited on") {
    const std::string fifo = dir.path() + "/fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK(contains(read_secret_file(fifo).error, "is not a regular file"));
  }
  SECTION("empty, or only line breaks") {
    for (const char* bytes : {"", "\n", "\r\n"}) {
      const auto r = read_secret_file(write_file(dir, "e", bytes));
      CHECK(r.empty);
      CHECK(contains(r.error, "is empty"));
    }
  }
  SECTION("a line break or a control character inside") {
    for (const char* bytes : {"two\nlines", "a\rb", "nul\x01"}) {
      const auto r = read_secret_file(write_file(dir, "f", bytes));
      CHECK(r.value.empty());
      CHECK(contains(r.error, "control character"));
    }
  }
  SECTION("too long") {
    const auto r = read_secret_file(write_file(dir, "g", std::string(max_secret_bytes + 1, 'x')));
    CHECK(contains(r.error, "more than 4096 bytes"));
  }
}

TEST_CASE("secrets readable by others are found in key files and in the config file",
          "[config][secrets]") {
  temp_dir dir;
  const auto open_key = write_file(dir, "open-key", "k", 0644);
  const auto group_key = write_file(dir, "group-key", "k", 0640);
  const auto open_yaml = write_file(dir, "open.yaml", "", 0644);
  const auto closed_yaml = write_file(dir, "closed.yaml", "", 0600);
  CHECK(readable_by_others(open_key));
  CHECK_FALSE(readable_by_others(group_key));
  CHECK_FALSE(readable_by_others(dir.path() + "/nope"));

  config cfg;
  CHECK(exposed_secrets(cfg, open_yaml).empty());  // no secret at all
  cfg.upstream.api_key = "k";
  cfg.upstream.api_key_file = open_key;
  cfg.admin.token = "t";
  cfg.admin.token_file = group_key;
  auto found = exposed_secrets(cfg, closed_yaml);
  REQUIRE(found.size() == 1);
  CHECK(found[0].key == "upstream.apiKey");
  CHECK(found[0].path == open_key);

  config inline_keys;  // in the YAML itself: the config file's mode counts
  inline_keys.admin.token = "t";
  inline_keys.servers.push_back(named_server("gpu"));
  inline_keys.servers[0].upstream.api_key = "k";
  found = exposed_secrets(inline_keys, open_yaml);
  REQUIRE(found.size() == 2);
  CHECK(found[0].key == "servers.gpu.apiKey");
  CHECK(found[1].key == "admin.token");
  CHECK(found[1].path == open_yaml);
  CHECK(exposed_secrets(inline_keys, closed_yaml).empty());
  CHECK(exposed_secrets(inline_keys, "").empty());  // no config file: flags and environment
}

TEST_CASE("the environment, then systemd credentials, fill secrets the config leaves empty",
          "[config][secrets]") {
  temp_dir creds;
  secret_environment env;
  env.credentials_directory = creds.path();
  config cfg;

  SECTION("no source: nothing") {
    CHECK_FALSE(apply_secret_sources(cfg, env));
    CHECK(cfg.upstream.api_key.empty());
    CHECK(cfg.admin.token.empty());
  }
  SECTION("credentials, trailing newline stripped") {
    write_file(creds, "upstream-api-key", "from-cred\n", 0400);
    write_file(creds, "admin-token", "tok\n", 0400);
    CHECK_FALSE(apply_secret_sources(cfg, env));
    CHECK(cfg.upstream.api_key == "from-cred");
    CHECK(cfg.admin.token == "tok");
  }
  SECTION("the unit's fallback, a lone line break, is no key") {
    write_file(creds, "upstream-api-key", "\n", 0400);
    CHECK_FALSE(apply_secret_sources(cfg, env));
    CHECK(cfg.upstream.api_key.empty());
  }
  SECTION("the environment before credentials, the config before both") {
    write_file(creds, "upstream-api-key", "from-cred", 0400);
    env.upstream_api_key = "from-env";
    env.admin_token = "tok-env";
    cfg.admin.token = "tok-config";
    CHECK_FALSE(apply_secret_sources(cfg, env));
    CHECK(cfg.upstream.api_key == "from-env");
    CHECK(cfg.admin.token == "tok-config");
  }
  SECTION("a credential that is no key is an error naming it") {
    write_file(creds, "upstream-api-key", "two\nlines", 0400);
    const auto err = apply_secret_sources(cfg, env);
    REQUIRE(err);
    CHECK(contains(*err, "systemd credential upstream-api-key"));
    CHECK(contains(*err, "control character"));
  }
  SECTION("with servers: each names its own key; the single key goes nowhere") {
    env.upstream_api_key = "from-env";
    cfg.servers.push_back(named_server("gpu"));
    CHECK_FALSE(apply_secret_sources(cfg, env));
    CHECK(cfg.upstream.api_key.empty());
    CHECK(cfg.servers[0].upstream.api_key.empty());
  }
}

}  // namespace secrets_test
