// Medians for bench programs: of a list of figures, and the median wall time of a call over repeats after warm-ups.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace hpctrain::bench {

inline constexpr int warmup_calls = 3;

// The median of `values` (the mean of the middle two for an even count); `values` must not be empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// Milliseconds: the median of `repeats` timed calls after warmup_calls untimed ones.
inline double median_ms(int repeats, const std::function<void()>& call) {
  std::vector<double> times;
  for (int repeat = 0; repeat < repeats + warmup_calls; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    call();
    const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
    if (repeat >= warmup_calls) times.push_back(elapsed.count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace hpctrain::bench
