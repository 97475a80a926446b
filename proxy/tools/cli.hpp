// The operator's command line: `kvpersist status|list|save|restore|invalidate|purge|flush|gc`
// talk to a running daemon's admin API; `kvpersist doctor` checks llama-server directly.
#pragma once

#include <string>
#include <vector>

namespace kvp::proxy {

// Exit codes (documented in --help): 0 ok, 1 the operation failed or doctor found a
// problem, 2 usage or configuration error, 3 the admin API or llama-server is unreachable.
int run_admin_command(const std::string& command, const std::vector<std::string>& args);
int run_doctor(const std::vector<std::string>& args);

}  // namespace kvp::proxy
