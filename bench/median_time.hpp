// Timing of bench programs: the median wall time of a call over repeats, after warm-up calls.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace hpctrain::bench {

inline constexpr int warmup_calls = 3;

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
