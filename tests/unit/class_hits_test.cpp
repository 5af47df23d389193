// Backend::count_class_hits (issue 16: evaluation counts on the backend, no copy of the model's output) against a
// naive host reference: the sequential argmax of kernel_math::row_argmax and the top-5 rule evaluation counted on the
// host before (fewer than 5 scores strictly above the target's), on random scores with ties injected, NaN scores,
// ignored targets (-100), in every dtype; counts NaN-poisoned before a call that overwrites them, then added to; and
// the argmax hits equal to the cross-entropy kernel's `correct` (the accuracy training reported before). And
// Backend::score_targets (predict's per-position argmax and log p(target)) against the formula predict computed on
// the host before, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;  // NOLINT(google-build-using-namespace): test harness

struct Hits {
  double argmax = 0.0, top5 = 0.0;
};

// Scores compared as stored (exact in double); the rules spelled out one row at a time.
Hits reference_hits(const std::vector<double>& scores, const std::vector<std::int32_t>& targets, std::int64_t cols) {
  Hits hits;
  for (std::size_t row = 0; row < targets.size(); ++row) {
    const std::int32_t target = targets[row];
    if (target == -100) continue;
    const double* values = scores.data() + row * static_cast<std::size_t>(cols);
    std::int64_t argmax = 0, above = 0;
    for (std::int64_t k = 0; k < cols; ++k) {
      if (values[k] > values[argmax]) argmax = k;
      if (values[k] > values[target]) ++above;
    }
    hits.argmax += argmax == target ? 1.0 : 0.0;
    hits.top5 += above < 5 ? 1.0 : 0.0;
  }
  return hits;
}

// Scores on a coarse grid (integers in [-levels, levels]): many ties, including with the target and the maximum.
std::vector<double> tied_scores(std::size_t count, std::uint64_t seed, int levels) {
  std::vector<double> values = random_values(count, seed, -levels - 0.5, levels + 0.5);
  for (double& value : values) value = std::round(value);
  return values;
}

// Targets in [0, cols), every seventh one ignored; some rows' targets moved onto the first or the last index of their
// maximum (a hit only if no tie comes before it).
std::vector<std::int32_t> targets_for(const std::vector<double>& scores, std::int64_t rows, std::int64_t cols,
                                      std::uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
  for (std::int64_t row = 0; row < rows; ++row) {
    auto& target = targets[static_cast<std::size_t>(row)];
    target = static_cast<std::int32_t>(generator() % static_cast<std::uint64_t>(cols));
    if (row % 7 == 3) target = -100;
    if (row % 5 == 1 || row % 5 == 2) {  // the row's maximum at its last (5k + 1) or first (5k + 2) index
      const double* values = scores.data() + row * cols;
      std::int64_t first = 0, last = 0;
      for (std::int64_t k = 0; k < cols; ++k) {
        if (values[k] > values[first]) first = k;
        if (values[k] >= values[last]) last = k;
      }
      target = static_cast<std::int32_t>(row % 5 == 1 ? last : first);
    }
  }
  return targets;
}

class ClassHits : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend();

  Hits count(const TestTensor& scores, const TestArray<std::int32_t>& targets, TestArray<double>& counts,
             bool accumulate) {
    backend->count_class_hits(scores.view(), targets.data(), counts.data(), accumulate);
    const std::vector<double> got = counts.get();
    return {got[0], got[1]};
  }
};

TEST_F(ClassHits, MatchTheHostReferenceWithTiesInEveryDtype) {
  struct Shape {
    std::int64_t rows, cols;
    int levels;  // 0: continuous scores
  };
  for (const Shape shape : {Shape{61, 37, 3}, Shape{40, 6, 1}, Shape{29, 1000, 0}, Shape{33, 1000, 8}})
    for (DType dtype : all_dtypes) {
      const std::string where = std::string(dtype_name(dtype)) + " " + std::to_string(shape.rows) + " x " +
                                std::to_string(shape.cols) + " levels " + std::to_string(shape.levels);
      TestTensor scores(*backend, dtype, shape.rows, shape.cols);
      const auto count_values = static_cast<std::size_t>(shape.rows * shape.cols);
      std::vector<double> values =
          shape.levels > 0 ? tied_scores(count_values, 7, shape.levels) : random_values(count_values, 7, -3.0, 3.0);
      values = quantized(dtype, values);  // bf16/f16 rounding adds ties of their own
      scores.set(values);
      const auto target_values = targets_for(values, shape.rows, shape.cols, 8);
      TestArray<std::int32_t> targets(*backend, target_values);
      const Hits want = reference_hits(values, target_values, shape.cols);
      ASSERT_GT(want.argmax, 0.0) << where;  // the cases exercise hits and misses of both kinds
      if (shape.levels > 0) ASSERT_LT(want.argmax, want.top5) << where;  // ties put targets among the top 5
      TestArray<double> counts(*backend, std::vector<double>(2, std::numeric_limits<double>::quiet_NaN()));
      Hits got = count(scores, targets, counts, false);
      EXPECT_EQ(got.argmax, want.argmax) << where;
      EXPECT_EQ(got.top5, want.top5) << where;
      got = count(scores, targets, counts, true);  // added to what is there
      EXPECT_EQ(got.argmax, 2 * want.argmax) << where;
      EXPECT_EQ(got.top5, 2 * want.top5) << where;
      // The accuracy evaluation reported before: the cross-entropy kernel's correct rows.
      TestArray<LossSums> sums(*backend, std::vector<LossSums>{LossSums{}});
      backend->softmax_cross_entropy(scores.view(), targets.data(), nullptr, TensorView{}, sums.data());
      EXPECT_EQ(sums.get()[0].correct, want.argmax) << where;
    }
}

TEST_F(ClassHits, IgnoredTargetsNaNScoresAndEdgeRows) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::int64_t cols = 7;
  const std::vector<double> values = {
      1,   2,   3, 4, 5, 6, 7,  // target 2: 4 above -> top-5 hit, no argmax hit
      1,   2,   3, 4, 5, 6, 7,  // target 1: 5 above -> neither
      5,   5,   5, 5, 5, 5, 5,  // all tied, target 6: argmax is 0 -> top-5 hit only
      5,   5,   5, 5, 5, 5, 5,  // all tied, target 0: both
      nan, 9,   1, 1, 1, 1, 1,  // NaN first: the argmax is 0 (target 0), nothing is above a NaN target: both
      2,   nan, 9, 1, 1, 1, 1,  // a later NaN never wins: argmax 2 (target 2): both
      2,   nan, 9, 1, 1, 1, 1,  // target 1 (NaN score): nothing above it -> top-5 hit only
      9,   9,   9, 9, 9, 0, 0,  // target 5: 5 above -> neither
      7,   1,   1, 1, 1, 1, 1,  // ignored (-100): neither, though its argmax is 0
  };
  const std::vector<std::int32_t> target_values = {2, 1, 6, 0, 0, 2, 1, 5, -100};
  for (DType dtype : all_dtypes) {
    TestTensor scores(*backend, dtype, 9, cols);
    scores.set(values);
    TestArray<std::int32_t> targets(*backend, target_values);
    TestArray<double> counts(*backend, std::vector<double>(2, nan));
    const Hits got = count(scores, targets, counts, false);
    EXPECT_EQ(got.argmax, 3.0) << dtype_name(dtype);
    EXPECT_EQ(got.top5, 6.0) << dtype_name(dtype);
    const Hits want = reference_hits(values, target_values, cols);
    EXPECT_EQ(got.argmax, want.argmax) << dtype_name(dtype);
    EXPECT_EQ(got.top5, want.top5) << dtype_name(dtype);
  }
}

TEST_F(ClassHits, NoRowsOverwriteOrKeepTheCounts) {
  TestTensor scores(*backend, DType::f32, 0, 5);
  TestArray<std::int32_t> targets(*backend, 1);
  TestArray<double> counts(*backend, std::vector<double>{std::numeric_limits<double>::quiet_NaN(), 4.0});
  Hits got = count(scores, targets, counts, false);
  EXPECT_EQ(got.argmax, 0.0);
  EXPECT_EQ(got.top5, 0.0);
  counts.set({3.0, 4.0});
  got = count(scores, targets, counts, true);
  EXPECT_EQ(got.argmax, 3.0);
  EXPECT_EQ(got.top5, 4.0);
}

// predict's host formula of before: the first maximum; x[t] - max - log sum exp(x - max), summed in double in order.
void reference_scores(const std::vector<double>& logits, const std::vector<std::int32_t>& targets, std::int64_t cols,
                      std::vector<std::int32_t>& argmax, std::vector<float>& log_probability) {
  for (std::size_t row = 0; row < targets.size(); ++row) {
    const double* x = logits.data() + row * static_cast<std::size_t>(cols);
    std::int64_t first = 0;
    for (std::int64_t k = 1; k < cols; ++k)
      if (x[k] > x[first]) first = k;
    argmax.push_back(static_cast<std::int32_t>(first));
    const std::int32_t target = targets[row];
    if (target < 0 || target >= cols) {
      log_probability.push_back(std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    double total = 0.0;
    for (std::int64_t k = 0; k < cols; ++k) total += std::exp(x[k] - x[first]);
    log_probability.push_back(static_cast<float>(x[target] - x[first] - std::log(total)));
  }
}

TEST_F(ClassHits, ScoreTargetsIsPredictsHostFormula) {
  const std::int64_t rows = 45, cols = 300;
  for (DType dtype : all_dtypes) {
    TestTensor logits(*backend, dtype, rows, cols);
    auto values = random_values(static_cast<std::size_t>(rows * cols), 17, -6.0, 6.0);
    for (std::size_t i = 0; i < values.size(); i += 3) values[i] = std::round(values[i]);  // tied maxima
    values = quantized(dtype, values);
    logits.set(values);
    const auto target_values = targets_for(values, rows, cols, 18);  // with -100s
    TestArray<std::int32_t> targets(*backend, target_values);
    TestArray<std::int32_t> argmax(*backend, std::vector<std::int32_t>(rows, -1));
    TestArray<float> log_probability(*backend, std::vector<float>(rows, std::numeric_limits<float>::quiet_NaN()));
    backend->score_targets(logits.view(), targets.data(), argmax.data(), log_probability.data());
    std::vector<std::int32_t> want_argmax;
    std::vector<float> want_log_probability;
    reference_scores(values, target_values, cols, want_argmax, want_log_probability);
    EXPECT_EQ(argmax.get(), want_argmax) << dtype_name(dtype);
    const std::vector<float> got = log_probability.get();
    for (std::int64_t row = 0; row < rows; ++row) {
      const auto r = static_cast<std::size_t>(row);
      if (target_values[r] == -100) {
        EXPECT_TRUE(std::isnan(got[r])) << dtype_name(dtype) << " row " << row;
      } else {
        EXPECT_EQ(got[r], want_log_probability[r]) << dtype_name(dtype) << " row " << row;  // NaN never passes
        EXPECT_LT(got[r], 0.0f);
      }
    }
  }
}

}  // namespace
}  // namespace hpctrain
