// Numbers as text; the median; slices of a count.
#include "hpctrain/core/numbers.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace hpctrain {

std::pair<std::int64_t, std::int64_t> rank_slice(std::int64_t count, int ranks, int rank, std::int64_t granule) {
  const std::int64_t granules = (count + granule - 1) / granule;
  // 128-bit products: r * N overflows 64 bits only for absurd N, but costs nothing to rule out.
  const auto edge = [&](int r) {
    return std::min(count, static_cast<std::int64_t>(static_cast<__int128>(granules) * r / ranks) * granule);
  };
  return {edge(rank), edge(rank + 1)};
}

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

std::string shortest_number_text(double value) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

std::string byte_size_text(std::uintmax_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

}  // namespace hpctrain
