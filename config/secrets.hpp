// Secrets kept out of the YAML file (docs/design.md §22): llama-server's API key and the admin
// token from a file (upstream.apiKeyFile, admin.tokenFile), the environment
// ($KVP_UPSTREAM_API_KEY, $KVP_ADMIN_TOKEN) or a systemd credential ($CREDENTIALS_DIRECTORY).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"

namespace kvp::config {

// A key longer than this is not a key (llama-server's HTTP parser takes 8 KiB per field).
inline constexpr std::size_t max_secret_bytes = 4096;

// The systemd credential names kvpersist reads (systemd/kvpersist.service loads them).
inline constexpr std::string_view upstream_api_key_credential = "upstream-api-key";
inline constexpr std::string_view admin_token_credential = "admin-token";

// A secret read from a file: `value` without its trailing line breaks, or `error` saying why
// the file cannot be used (naming the path); `empty` when it holds nothing but line breaks.
struct secret_read {
  std::string value;
  std::string error;
  bool empty = false;
};

// Reads the secret in the regular file at `path` (symlinks followed: container runtimes mount
// secrets as links), at most max_secret_bytes. Trailing CR/LF are stripped. Errors: the file
// cannot be opened or read, is not a regular file, is larger, is empty, or holds a line break
// or another control character (the value goes into an HTTP header).
secret_read read_secret_file(const std::string& path);

// True when users other than the owner and the group of `path` may read it (mode o+r).
// False when it cannot be inspected.
bool readable_by_others(const std::string& path);

// A secret that users other than its file's owner and group can read: `key` ("upstream.apiKey")
// and the file holding it (a key file, or the configuration file itself).
struct exposed_secret {
  std::string key;
  std::string path;
};

// The secrets of a freshly loaded `cfg` (before apply_secret_sources) that are readable by
// others: a key file with mode o+r, or the configuration file at `config_path` ("" = none)
// when it holds upstream.apiKey, a server's apiKey or admin.token itself.
std::vector<exposed_secret> exposed_secrets(const config& cfg, const std::string& config_path);

// Where secrets come from besides the configuration file ("" = unset).
struct secret_environment {
  std::string upstream_api_key;       // $KVP_UPSTREAM_API_KEY
  std::string admin_token;            // $KVP_ADMIN_TOKEN
  std::string credentials_directory;  // $CREDENTIALS_DIRECTORY, set by systemd
};

// The process's environment as a secret_environment.
secret_environment read_secret_environment();

// Fills what the configuration leaves empty: upstream.apiKey (only without `servers:`, whose
// entries each name their own key, so one key never goes to another host) and admin.token,
// each from its environment variable, else from its systemd credential in
// env.credentials_directory. A missing credential, or one that holds only a line break (the
// unit's SetCredential= fallback), counts as absent. Returns why a credential cannot be used.
std::optional<std::string> apply_secret_sources(config& cfg, const secret_environment& env);

}  // namespace kvp::config
