// Per-channel statistics of a features dataset (min, max, mean, standard deviation), computed in one streaming pass in
// bounded memory, for `hpctrain data inspect` and for choosing data.scale / data.shift.
//
// The channel is the second dimension: (N, F) has F channels of one value per sample, (N, C, H, W) has C channels of
// H x W values per sample, (N) has one channel. Each block of rows is summarised exactly in double (two passes over
// the block in memory), and blocks are merged with Chan, Golub and LeVeque's pairwise update, which stays accurate for
// any number of values (a single running sum of squares would lose the variance to cancellation).
#pragma once

#include <cstdint>
#include <vector>

namespace hpctrain {

class Hdf5Dataset;

struct ChannelStatistics {
  std::int64_t count = 0;       // finite values
  std::int64_t non_finite = 0;  // NaN and Inf, left out of everything else
  double minimum = 0.0, maximum = 0.0, mean = 0.0;
  double squared_deviations = 0.0;  // sum of (x - mean)^2

  // Population standard deviation (divides by count, as numpy.std does by default).
  [[nodiscard]] double standard_deviation() const;
  // Merge the statistics of another, disjoint set of values into these.
  void combine(const ChannelStatistics& other);
  // Statistics of count values spaced `stride` apart.
  static ChannelStatistics of(const double* values, std::int64_t count, std::int64_t stride = 1);
};

// One entry per channel. Reads blocks of about block_values values.
std::vector<ChannelStatistics> channel_statistics(Hdf5Dataset& dataset, std::int64_t block_values = 1 << 20);

}  // namespace hpctrain
