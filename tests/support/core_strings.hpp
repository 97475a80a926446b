// Catch2 renderings of core enums, so a failed CHECK prints "dirty" instead of "6".
// Include after <catch2/catch.hpp>.
#pragma once

#include <string>

#include "core/breaker.hpp"
#include "core/slot_pool.hpp"
#include "core/errc.hpp"
#include "core/request_class.hpp"

namespace Catch {

template <>
struct StringMaker<kvp::core::slot_state> {
  static std::string convert(kvp::core::slot_state v) {
    return std::string(kvp::core::to_string(v));
  }
};
template <>
struct StringMaker<kvp::core::prepare_kind> {
  static std::string convert(kvp::core::prepare_kind v) {
    return std::string(kvp::core::to_string(v));
  }
};
template <>
struct StringMaker<kvp::core::breaker::state> {
  static std::string convert(kvp::core::breaker::state v) {
    return std::string(kvp::core::to_string(v));
  }
};
template <>
struct StringMaker<kvp::core::errc> {
  static std::string convert(kvp::core::errc v) { return std::string(kvp::core::to_string(v)); }
};
template <>
struct StringMaker<kvp::core::endpoint_kind> {
  static std::string convert(kvp::core::endpoint_kind v) {
    switch (v) {
      case kvp::core::endpoint_kind::inference:
        return "inference";
      case kvp::core::endpoint_kind::slots:
        return "slots";
      case kvp::core::endpoint_kind::passthrough:
        return "passthrough";
    }
    return "?";
  }
};

}  // namespace Catch
