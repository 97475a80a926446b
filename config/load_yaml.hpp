// Loading the YAML configuration file into config::config. The only entry point to yaml-cpp,
// which stays private to load_yaml.cpp; errors come back as values naming file:line:column.
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include "config/config.hpp"

namespace kvp::config {

// Why a configuration could not be loaded. `line` and `column` are 1-based; 0 when unknown
// (e.g. the file could not be read, or only the line is known). The config edge's error
// (docs/conventions.md §2): it is read once, at startup, by a person fixing a file, so it
// carries a position where core::error carries an errc for logs and HTTP answers.
struct config_error {
  std::string file;
  int line = 0;
  int column = 0;
  std::string message;

  // "FILE:LINE:COL: message"; "FILE:LINE: message" without a column, "FILE: message" without
  // a line. This is the form compilers use, so editors can jump to it.
  std::string to_string() const;
};

// Parses the YAML document `text` into a config, starting from the defaults; `file_name` is
// only used in errors. An empty document or `null` gives the defaults. Errors: malformed
// YAML, a top level that is not a map, unknown or duplicate keys (typos must not be silently
// ignored), wrong types, bad enum values (the message lists the allowed ones), and anything
// validate() rejects, each pointing at the offending node. Never throws.
std::variant<config, config_error> load_yaml_string(std::string_view text,
                                                    std::string_view file_name);

// load_yaml_string() on the contents of the file at `path`. A missing or unreadable file is
// an error with line 0. Never throws.
std::variant<config, config_error> load_yaml_file(const std::string& path);

}  // namespace kvp::config
