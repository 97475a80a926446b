// The dashboard's static files (proxy/ui/), compiled into the binary by proxy/ui/embed.cmake.
#pragma once

#include <span>
#include <string_view>

namespace kvp::proxy {

struct ui_asset {
  std::string_view name;  // file name in proxy/ui/: "index.html", "app.js", ...
  std::string_view body;
};

std::span<const ui_asset> ui_assets();

}  // namespace kvp::proxy
