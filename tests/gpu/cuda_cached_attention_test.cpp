// The CUDA backend's cached attention (incremental decoding, Backend::cached_attention) against the CPU backend's (the
// reference, itself checked against an f64 reference in tests/unit/cached_attention_test.cpp): caches shorter and
// longer than one chunk of keys (128) and several chunks, head_dim 5 to 200 (beyond the fused kernel's 64 and the
// block's 128 threads), first > 0, count > 1, the whole window at once. Random inputs, the output poisoned with NaN and
// the cache rows after the new positions NaN (never read), tolerances per storage dtype; the appended rows must be
// the same bits on both backends, and a second run must give the same bits. f64 is refused. Skips (77) without a
// GPU; HPCTRAIN_GPU_TEST_SELF_CHECK=1 runs it CPU against CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_support.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {
namespace {

struct Case {
  std::int64_t sequence, heads, head_dim, first, count;
};

// Both sum in fp32 in different orders (exp2 and chunks of 128 keys against exp key by key): a few 1e-6 relative in
// f32; in bf16/f16 the rounding of the stored output dominates.
double cached_tolerance(DType dtype) { return dtype == DType::f32 ? 2e-5 : tolerance(dtype); }

TEST_F(CudaVsCpu, CachedAttentionMatchesTheCpuBackend) {
  const Case cases[] = {
      {40, 2, 16, 0, 5},       // the prompt at the start
      {40, 3, 8, 17, 4},       // new positions after a cached prefix
      {300, 2, 64, 250, 3},    // two and three chunks of keys
      {1024, 4, 64, 1023, 1},  // the last position of a long window: eight chunks
      {9, 1, 5, 8, 1},         // a head_dim that is no power of two
      {130, 2, 200, 100, 30},  // head_dim beyond the block's threads
      {64, 2, 128, 0, 64},     // the whole window at once, head_dim 128
  };
  for (DType dtype : gpu_dtypes)
    for (const Case& c : cases) {
      const AttentionGeometry g = make_attention(1, c.sequence, c.heads, c.head_dim, true);
      const std::int64_t width = g.width();
      const std::string where =
          describe(g, dtype) + " first " + std::to_string(c.first) + " count " + std::to_string(c.count);
      auto cache = pair(dtype, c.sequence, 2 * width);
      auto qkv = pair(dtype, c.count, 3 * width);
      auto out = pair(dtype, c.count, width);
      auto cache_values = cache.randomize(31 + static_cast<std::uint64_t>(c.first), -2.0, 2.0);
      for (auto e = static_cast<std::size_t>(c.first * 2 * width); e < cache_values.size(); ++e)
        cache_values[e] = std::numeric_limits<double>::quiet_NaN();
      cache.set(cache_values);
      qkv.randomize(37 + static_cast<std::uint64_t>(c.head_dim), -2.0, 2.0);  // scores of a few units
      out.poison();
      cpu->cached_attention(g, qkv.cpu(), cache.cpu().data, c.first, out.cpu());
      gpu->cached_attention(g, qkv.gpu(), cache.gpu().data, c.first, out.gpu());
      EXPECT_LE(out.difference(), cached_tolerance(dtype)) << where;
      // The appended rows: the same bits (rows past first + count stay NaN on both).
      const auto appended_begin = static_cast<std::size_t>(c.first * 2 * width),
                 appended_end = static_cast<std::size_t>((c.first + c.count) * 2 * width);
      EXPECT_EQ(cache.gpu_values(0, appended_end), cache.cpu_values(0, appended_end)) << "cache, " << where;
      EXPECT_FALSE(has_nan(cache.gpu_values(appended_begin, appended_end))) << "cache, " << where;

      // Deterministic: a second run gives the same bits.
      const auto first_run = out.gpu_values(0, static_cast<std::size_t>(c.count * width));
      out.poison();
      gpu->cached_attention(g, qkv.gpu(), cache.gpu().data, c.first, out.gpu());
      EXPECT_EQ(out.gpu_values(0, static_cast<std::size_t>(c.count * width)), first_run)
          << "not reproducible, " << where;
    }
}

TEST_F(CudaVsCpu, CachedAttentionRefusesF64) {
  if (self_check()) GTEST_SKIP() << "the CPU backend takes f64";
  const AttentionGeometry g = make_attention(1, 8, 1, 16, true);
  TestTensor cache(*gpu, DType::f64, 8, 32), qkv(*gpu, DType::f64, 1, 48), out(*gpu, DType::f64, 1, 16);
  EXPECT_THROW(gpu->cached_attention(g, qkv.view(), cache.data(), 0, out.view()), NotSupported);
}

}  // namespace
}  // namespace hpctrain
