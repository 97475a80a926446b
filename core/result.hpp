// A value or an error, for fallible operations whose failure is an expected outcome
// (a management call that failed, a manifest that does not parse). No exceptions.
// The one error shape at every edge (docs/conventions.md §2). Not boost::system::result:
// core/ includes no Boost (docs/conventions.md §1), and its error is a core::errc with a
// message and the HTTP status involved, which a std::error_code cannot carry.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

#include "core/errc.hpp"

namespace kvp::core {

// An error as a value: a stable code, the HTTP status if one was involved, a message
// for logs and error bodies (never shown to the model), and, for an error that passes,
// the seconds after which a retry may succeed (an answer's Retry-After).
struct error {
  errc code = errc::invariant;
  int http_status = 0;
  std::string message;
  unsigned retry_after_s = 0;
};

template <class T>
class [[nodiscard]] result {
 public:
  result() : v_(error{}) {}                         // an unset error (for futures)
  result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  result(error err) : v_(std::move(err)) {}         // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { assert(ok()); return std::get<0>(v_); }
  const T& value() const { assert(ok()); return std::get<0>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const error& err() const { assert(!ok()); return std::get<1>(v_); }

 private:
  std::variant<T, error> v_;
};

struct unit {};

}  // namespace kvp::core
