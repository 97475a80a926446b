#include "core/metrics.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace kvp::core {

void histogram::observe(double v) {
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (v <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += v;
}

std::string escape_label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{}", v);
}
}  // namespace

void prom_writer::family(std::string_view name, std::string_view type, std::string_view help) {
  fams_.push_back(fam{std::string(name),
                      fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type), ""});
}

void prom_writer::sample(std::string_view name, std::string_view labels, double value) {
  if (fams_.empty()) fams_.push_back(fam{std::string(name), "", ""});
  if (labels.empty())
    current().samples += fmt::format("{} {}\n", name, num(value));
  else
    current().samples += fmt::format("{}{{{}}} {}\n", name, labels, num(value));
}

void prom_writer::merge(const prom_writer& other) {
  for (const auto& f : other.fams_) {
    auto it = std::find_if(fams_.begin(), fams_.end(), [&](const fam& m) { return m.name == f.name; });
    if (it == fams_.end())
      fams_.push_back(f);
    else
      it->samples += f.samples;
  }
}

std::string prom_writer::text() const {
  std::string out;
  for (const auto& f : fams_) out += f.header + f.samples;
  return out;
}

void prom_writer::histo(std::string_view name, std::string_view labels, const histogram& h) {
  const std::string sep = labels.empty() ? "" : ",";
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i < h.bounds().size(); ++i) {
    cum += h.counts()[i];
      current().samples +=
        fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, num(h.bounds()[i]), cum);
  }
  current().samples += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, h.count());
  sample(fmt::format("{}_sum", name), labels, h.sum());
  sample(fmt::format("{}_count", name), labels, static_cast<double>(h.count()));
}

}  // namespace kvp::core
