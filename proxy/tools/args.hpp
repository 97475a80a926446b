// The one helper the command-line tools (cli, doctor, serve) read flag values with.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kvp::proxy {

// args[i] is a flag that takes a value: moves `i` onto the value and stores it in `out`.
// False when the flag is the last argument.
inline bool take_value(const std::vector<std::string>& args, std::size_t& i, std::string& out) {
  if (i + 1 >= args.size()) return false;
  out = args[++i];
  return true;
}

}  // namespace kvp::proxy
