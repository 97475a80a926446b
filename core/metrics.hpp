// Prometheus text exposition (format 0.0.4) built from plain values: counters, gauges and
// fixed-bucket histograms. Formatting only; the admin API serves it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvp::core {

class histogram {
 public:
  explicit histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<std::uint64_t>& counts() const { return counts_; }  // per bucket, not cumulative
  std::uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;
  std::uint64_t count_ = 0;
  double sum_ = 0;
};

// Appends metric families to a text buffer. Labels are given pre-rendered as
// `name="value",...` (values escaped with escape_label).
// Samples are grouped under their family, so writers for several servers can be merged
// into one valid exposition (one HELP/TYPE per family, its samples together).
class prom_writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help);
  // REQUIRES: family() was called for `name`'s family (a histogram's too) before.
  void sample(std::string_view name, std::string_view labels, double value);
  void histo(std::string_view name, std::string_view labels, const histogram& h);
  // Appends `other`'s samples to the same families (adding families it has that we lack).
  void merge(const prom_writer& other);
  std::string text() const;

 private:
  struct fam {
    std::string name, header, samples;
  };
  std::vector<fam> fams_;
  fam& current() { return fams_.back(); }
};

std::string escape_label(std::string_view v);

}  // namespace kvp::core
