// Argmax and top-5 hits of rows of class scores on the CPU: one pass over each row (the target's score read first),
// rows in parallel, the hits summed as integers (exact, so the thread count does not matter). And predict's per-row
// argmax and log-probability of the target, with the formula predict used on the host before (the sum in double).
#include "cpu_class_hits.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/half.hpp"

namespace hpctrain::cpu {

void count_class_hits(const TensorView& scores, const std::int32_t* targets, double* counts, bool accumulate) {
  HPCTRAIN_ASSERT(scores.cols > 0 || scores.rows == 0, "count_class_hits: no classes");
  const std::int64_t rows = scores.rows, cols = scores.cols;
  std::int64_t argmax_hits = 0, top5_hits = 0;
  dispatch_dtype(scores.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const T* all = static_cast<const T*>(scores.data);
#pragma omp parallel for schedule(static) reduction(+ : argmax_hits, top5_hits) if (rows * cols > 16384)
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int32_t target = targets[i];
      if (target < 0 || target >= cols) continue;  // ignored (or not a class): never a hit
      const T* row = all + i * cols;
      const C target_score = load(row[target]);
      C largest = load(row[0]);
      std::int64_t argmax = 0, above = largest > target_score ? 1 : 0;
      for (std::int64_t j = 1; j < cols; ++j) {
        const C value = load(row[j]);
        above += value > target_score;
        if (value > largest) {  // strict: ties keep the lowest index (kernel_math::row_argmax)
          largest = value;
          argmax = j;
        }
      }
      argmax_hits += argmax == target;
      top5_hits += above < 5;
    }
  });
  const double argmax_count = static_cast<double>(argmax_hits), top5_count = static_cast<double>(top5_hits);
  counts[0] = accumulate ? counts[0] + argmax_count : argmax_count;
  counts[1] = accumulate ? counts[1] + top5_count : top5_count;
}

void score_targets(const TensorView& logits, const std::int32_t* targets, std::int32_t* argmax,
                   float* target_log_probability) {
  HPCTRAIN_ASSERT(logits.cols > 0 || logits.rows == 0, "score_targets: no classes");
  const std::int64_t rows = logits.rows, cols = logits.cols;
  dispatch_dtype(logits.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const T* all = static_cast<const T*>(logits.data);
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
    for (std::int64_t i = 0; i < rows; ++i) {
      const T* row = all + i * cols;
      C largest = load(row[0]);
      std::int64_t first_maximum = 0;
      for (std::int64_t j = 1; j < cols; ++j) {
        const C value = load(row[j]);
        if (value > largest) {
          largest = value;
          first_maximum = j;
        }
      }
      argmax[i] = static_cast<std::int32_t>(first_maximum);
      const std::int32_t target = targets[i];
      if (target < 0 || target >= cols) {
        target_log_probability[i] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      double total = 0.0;  // in column order, in double
      for (std::int64_t j = 0; j < cols; ++j) total += std::exp(static_cast<double>(load(row[j])) - largest);
      target_log_probability[i] =
          static_cast<float>(static_cast<double>(load(row[target])) - static_cast<double>(largest) - std::log(total));
    }
  });
}

}  // namespace hpctrain::cpu
