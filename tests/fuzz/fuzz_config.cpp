// Fuzz target: the YAML config loader (config::load_yaml_string). Never throws, never crashes;
// a config it returns has passed validate() (the loader's contract), and an error names the
// file and a position inside the document or none. Regression seed corpus/config/regress_stray_comma:
// a lone "," made yaml-cpp 0.7.0's LoadAll, which the loader used, allocate until killed (f961521).
#include <string>
#include <string_view>
#include <variant>

#include "config/load_yaml.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = kvp::config::load_yaml_string(text, "fuzz.yaml");
  if (auto* cfg = std::get_if<kvp::config::config>(&r)) {
    KVP_FUZZ_CHECK(!kvp::config::validate(*cfg).has_value());
    KVP_FUZZ_CHECK(cfg->threads >= 1);
  } else {
    const auto& e = std::get<kvp::config::config_error>(r);
    KVP_FUZZ_CHECK(!e.message.empty());
    KVP_FUZZ_CHECK(e.line >= 0 && e.column >= 0);
    KVP_FUZZ_CHECK(e.to_string().starts_with("fuzz.yaml"));
  }
  return 0;
}
