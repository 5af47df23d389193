// Streaming per-channel statistics: exact per block, merged pairwise.
#include "hpctrain/data/channel_statistics.hpp"

#include <algorithm>
#include <cmath>

#include "hpctrain/data/hdf5_dataset.hpp"

namespace hpctrain {

double ChannelStatistics::standard_deviation() const {
  return count > 0 ? std::sqrt(squared_deviations / static_cast<double>(count)) : 0.0;
}

void ChannelStatistics::combine(const ChannelStatistics& other) {
  non_finite += other.non_finite;
  if (other.count == 0) return;
  if (count == 0) {
    const std::int64_t bad = non_finite;
    *this = other;
    non_finite = bad;
    return;
  }
  const double n_a = static_cast<double>(count), n_b = static_cast<double>(other.count), n = n_a + n_b;
  const double delta = other.mean - mean;
  mean += delta * n_b / n;
  squared_deviations += other.squared_deviations + delta * delta * n_a * n_b / n;
  minimum = std::min(minimum, other.minimum);
  maximum = std::max(maximum, other.maximum);
  count += other.count;
}

ChannelStatistics ChannelStatistics::of(const double* values, std::int64_t count, std::int64_t stride) {
  ChannelStatistics statistics;
  double sum = 0.0;
  for (std::int64_t i = 0; i < count; ++i) {
    const double value = values[i * stride];
    if (!std::isfinite(value)) {
      ++statistics.non_finite;
      continue;
    }
    if (statistics.count == 0 || value < statistics.minimum) statistics.minimum = value;
    if (statistics.count == 0 || value > statistics.maximum) statistics.maximum = value;
    sum += value;
    ++statistics.count;
  }
  if (statistics.count == 0) return statistics;
  statistics.mean = sum / static_cast<double>(statistics.count);
  for (std::int64_t i = 0; i < count; ++i) {
    const double value = values[i * stride];
    if (std::isfinite(value)) statistics.squared_deviations += (value - statistics.mean) * (value - statistics.mean);
  }
  return statistics;
}

std::vector<ChannelStatistics> channel_statistics(Hdf5Dataset& dataset, std::int64_t block_values) {
  const auto& shape = dataset.shape();
  const std::int64_t channels = shape.size() >= 2 ? shape[1] : 1;
  const std::int64_t row = dataset.sample_size();  // values per sample = channels * inner
  const std::int64_t inner = channels > 0 ? row / channels : 0;
  std::vector<ChannelStatistics> result(static_cast<std::size_t>(channels));
  if (row == 0) return result;
  const std::int64_t block_rows = std::max<std::int64_t>(1, block_values / row);
  std::vector<double> block;  // (block_rows, channels, inner)
  for (std::int64_t first = 0; first < dataset.samples(); first += block_rows) {
    const std::int64_t rows = std::min(block_rows, dataset.samples() - first);
    block.resize(static_cast<std::size_t>(rows * row));
    dataset.read_range(first, rows, block.data());
    for (std::int64_t channel = 0; channel < channels; ++channel) {
      ChannelStatistics piece;
      if (inner == 1) {  // one value per sample: a strided walk down the column
        piece = ChannelStatistics::of(block.data() + channel, rows, row);
      } else {
        for (std::int64_t r = 0; r < rows; ++r)
          piece.combine(ChannelStatistics::of(block.data() + r * row + channel * inner, inner));
      }
      result[static_cast<std::size_t>(channel)].combine(piece);
    }
  }
  return result;
}

}  // namespace hpctrain
