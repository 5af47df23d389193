// Backend::cached_attention on the CPU backend (incremental decoding: the new positions' k and v appended to a (T, 2C)
// cache, then one-query attention of each new position over the cache up to itself) against a naive f64 reference, in
// every storage dtype: several cache lengths, heads and head dims, first > 0, count > 1, a whole prompt at once. The
// output is poisoned with NaN before the call, and the cache rows after the new positions hold NaN, so a kernel that
// reads beyond the causal limit or forgets an output cannot pass. Also: the appended rows equal the qkv rows' k and v
// bit for bit, the earlier rows stay as they were, results do not depend on the OpenMP thread count, and shapes
// outside the contract are refused.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;

struct Case {
  std::int64_t sequence, heads, head_dim, first, count;
};

const Case cases[] = {
    {40, 2, 16, 0, 5},     // the prompt at the start
    {40, 3, 8, 17, 4},     // several new positions after a cached prefix
    {300, 2, 64, 250, 3},  // a long cache
    {9, 1, 5, 8, 1},       // one position, the last of the window
    {64, 4, 32, 0, 64},    // the whole window at once
    {33, 2, 12, 32, 1},    // a single new position after 32 cached ones
};

// out (count, C) in f64: new position first + i attends to the reference cache rows [0, first + i], the new
// positions' k and v taken from qkv.
std::vector<double> reference_cached_attention(const AttentionGeometry& g, const std::vector<double>& cache,
                                               const std::vector<double>& qkv, std::int64_t first, std::int64_t count) {
  const std::int64_t width = g.width(), d = g.head_dim;
  auto key = [&](std::int64_t j, std::int64_t part, std::int64_t h, std::int64_t c) {  // part 0: k, 1: v
    if (j < first) return cache[static_cast<std::size_t>(j * 2 * width + part * width + h * d + c)];
    return qkv[static_cast<std::size_t>((j - first) * 3 * width + (part + 1) * width + h * d + c)];
  };
  std::vector<double> out(static_cast<std::size_t>(count * width));
  for (std::int64_t i = 0; i < count; ++i)
    for (std::int64_t h = 0; h < g.heads; ++h) {
      const std::int64_t keys = first + i + 1;
      std::vector<double> scores(static_cast<std::size_t>(keys));
      double largest = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < keys; ++j) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < d; ++c)
          dot += qkv[static_cast<std::size_t>(i * 3 * width + h * d + c)] * key(j, 0, h, c);
        scores[static_cast<std::size_t>(j)] = dot * static_cast<double>(g.scale);
        largest = std::max(largest, scores[static_cast<std::size_t>(j)]);
      }
      double total = 0.0;
      for (double& score : scores) total += score = std::exp(score - largest);
      for (std::int64_t c = 0; c < d; ++c) {
        double sum = 0.0;
        for (std::int64_t j = 0; j < keys; ++j) sum += scores[static_cast<std::size_t>(j)] * key(j, 1, h, c);
        out[static_cast<std::size_t>(i * width + h * d + c)] = sum / total;
      }
    }
  return out;
}

// Scores of a few units, as in a trained model. Cache rows at and after `first` hold NaN: they must be written
// (rows [first, first + count)) or never read (the rest).
struct Inputs {
  std::vector<double> cache, qkv;
};
Inputs random_inputs(const AttentionGeometry& g, DType dtype, const Case& c, std::uint64_t seed) {
  const std::int64_t width = g.width();
  Inputs inputs{quantized(dtype, random_values(static_cast<std::size_t>(c.sequence * 2 * width), seed, -2.0, 2.0)),
                quantized(dtype, random_values(static_cast<std::size_t>(c.count * 3 * width), seed + 1, -2.0, 2.0))};
  for (std::size_t e = static_cast<std::size_t>(c.first * 2 * width); e < inputs.cache.size(); ++e)
    inputs.cache[e] = std::numeric_limits<double>::quiet_NaN();
  return inputs;
}

std::string describe(const Case& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " T " + std::to_string(c.sequence) + " heads " + std::to_string(c.heads) +
         " head_dim " + std::to_string(c.head_dim) + " first " + std::to_string(c.first) + " count " +
         std::to_string(c.count);
}

TEST(CachedAttention, MatchesTheF64ReferenceAndAppendsTheNewKeysAndValues) {
  auto backend = make_cpu_backend();
  for (DType dtype : all_dtypes)
    for (const Case& c : cases) {
      const std::string where = describe(c, dtype);
      const AttentionGeometry g = make_attention(1, c.sequence, c.heads, c.head_dim, true);
      const std::int64_t width = g.width();
      const Inputs inputs = random_inputs(g, dtype, c, 71 + static_cast<std::uint64_t>(c.first));
      TestTensor cache(*backend, dtype, c.sequence, 2 * width), qkv(*backend, dtype, c.count, 3 * width),
          out(*backend, dtype, c.count, width);
      cache.set(inputs.cache);
      qkv.set(inputs.qkv);
      out.poison();
      backend->cached_attention(g, qkv.view(), cache.data(), c.first, out.view());
      const auto want = reference_cached_attention(g, inputs.cache, inputs.qkv, c.first, c.count);
      // fp32 sums over up to 300 keys: a few 1e-7 relative; 16-bit storage: the output's rounding.
      EXPECT_LE(relative_error(out.get(), want), dtype == DType::f32 ? 1e-5 : tolerance(dtype)) << where;

      // The cache: rows [0, first) unchanged, rows [first, first + count) = the qkv rows' k and v, the rest untouched.
      std::vector<double> expected_cache = inputs.cache;
      for (std::int64_t i = 0; i < c.count; ++i)
        for (std::int64_t e = 0; e < 2 * width; ++e)
          expected_cache[static_cast<std::size_t>((c.first + i) * 2 * width + e)] =
              inputs.qkv[static_cast<std::size_t>(i * 3 * width + width + e)];
      const auto got_cache = cache.get();
      for (std::size_t e = 0; e < got_cache.size(); ++e) {
        const bool both_nan = std::isnan(got_cache[e]) && std::isnan(expected_cache[e]);
        ASSERT_TRUE(both_nan || got_cache[e] == expected_cache[e]) << "cache element " << e << ", " << where;
      }
    }
}

// Decoding one position at a time gives what the fused attention gives for the whole sequence (the cached path of
// hpctrain generate against its recomputed one), in f64 where both are exact to rounding.
TEST(CachedAttention, StepByStepDecodingMatchesTheFusedAttention) {
  auto backend = make_cpu_backend();
  const AttentionGeometry g = make_attention(1, 23, 3, 8, true);
  const std::int64_t width = g.width(), steps = g.sequence;
  TestTensor all(*backend, DType::f64, steps, 3 * width), fused(*backend, DType::f64, steps, width);
  const auto values = all.randomize(5, -2.0, 2.0);
  fused.poison();
  TestArray<double> lse(*backend, static_cast<std::size_t>(g.heads * steps));
  backend->attention_forward(g, all.view(), fused.view(), lse.data());
  TestTensor cache(*backend, DType::f64, steps, 2 * width), row(*backend, DType::f64, 1, 3 * width),
      out(*backend, DType::f64, 1, width);
  cache.poison();
  std::vector<double> decoded;
  for (std::int64_t t = 0; t < steps; ++t) {
    row.set({values.begin() + t * 3 * width, values.begin() + (t + 1) * 3 * width});
    out.poison();
    backend->cached_attention(g, row.view(), cache.data(), t, out.view());
    const auto step = out.get();
    decoded.insert(decoded.end(), step.begin(), step.end());
  }
  EXPECT_LE(relative_error(decoded, fused.get()), 1e-13);
}

TEST(CachedAttention, ResultsDoNotDependOnTheThreadCount) {
  auto backend = make_cpu_backend();
  const Case c{200, 4, 32, 120, 40};
  const AttentionGeometry g = make_attention(1, c.sequence, c.heads, c.head_dim, true);
  const Inputs inputs = random_inputs(g, DType::f32, c, 9);
  std::vector<std::vector<double>> results;
  const int threads = omp_get_max_threads();
  for (int count : {1, 3}) {
    omp_set_num_threads(count);
    TestTensor cache(*backend, DType::f32, c.sequence, 2 * g.width()),
        qkv(*backend, DType::f32, c.count, 3 * g.width()), out(*backend, DType::f32, c.count, g.width());
    cache.set(inputs.cache);
    qkv.set(inputs.qkv);
    out.poison();
    backend->cached_attention(g, qkv.view(), cache.data(), c.first, out.view());
    results.push_back(out.get());
  }
  omp_set_num_threads(threads);
  EXPECT_FALSE(has_nan(results[0]));
  EXPECT_EQ(results[0], results[1]);
}

TEST(CachedAttention, RefusesShapesOutsideItsContract) {
  auto backend = make_cpu_backend();
  const AttentionGeometry g = make_attention(1, 8, 2, 4, true);
  TestTensor cache(*backend, DType::f32, 8, 16), qkv(*backend, DType::f32, 3, 24), out(*backend, DType::f32, 3, 8);
  EXPECT_THROW(backend->cached_attention(g, qkv.view(), cache.data(), 6, out.view()), Error) << "positions [6, 9) of 8";
  AttentionGeometry not_causal = g;
  not_causal.causal = false;
  EXPECT_THROW(backend->cached_attention(not_causal, qkv.view(), cache.data(), 0, out.view()), Error);
  EXPECT_THROW(backend->cached_attention(g, qkv.view(), cache.data(), 0, {out.data(), DType::f32, 2, 8}), Error);
}

}  // namespace
}  // namespace hpctrain
