// The dashboard's static files (proxy/admin/ui/), compiled into the binary by proxy/admin/ui/embed.cmake.
#pragma once

#include <span>
#include <string_view>

namespace kvp::proxy {

struct ui_asset {
  std::string_view name;  // file name in proxy/admin/ui/: "index.html", "app.js", ...
  std::string_view body;
};

std::span<const ui_asset> ui_assets();

}  // namespace kvp::proxy
