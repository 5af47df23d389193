// Backend::cached_attention on the CPU: one-query attention over a key/value cache for incremental decoding (hpctrain
// generate). Each (new position, head) is one task of an OpenMP loop; within it the scores, the softmax and the
// weighted values are summed key by key in the compute type (fp32; fp64 for f64) in one fixed order, so the results
// do not depend on the thread count and equal those of the host loop that did this before the operation moved into
// the backends. The dot products stay sequential over head_dim: vectorising them would reorder their sums and change
// the bits of every cached result (the weighted-value loop is element-wise and vectorises as it is).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_sequence.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {

namespace {

template <class T>
void cached_attention_typed(const AttentionGeometry& g, const T* qkv, std::int64_t count, const T* cache,
                            std::int64_t first, T* out) {
  using Compute = compute_t<T>;
  const std::int64_t width = g.width(), d = g.head_dim, tasks = count * g.heads;
  // One task per (new position, head); a few positions per call while decoding, the whole prompt at its start.
  const bool parallel = tasks > 1 && tasks * (first + count) * d > 32768;
#pragma omp parallel if (parallel)
  {
    std::vector<Compute> scores(static_cast<std::size_t>(first + count)), sum(static_cast<std::size_t>(d));
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t i = task / g.heads, h = task % g.heads;
      const std::int64_t keys = first + i + 1;   // causal: positions [0, first + i]
      const T* q = qkv + i * 3 * width + h * d;  // (3C) row: q, k, v
      Compute largest = -INFINITY;
      for (std::int64_t j = 0; j < keys; ++j) {
        const T* k = cache + j * 2 * width + h * d;  // (2C) cache row: k, v
        Compute dot = 0;
        for (std::int64_t c = 0; c < d; ++c) dot += load(q[c]) * load(k[c]);
        scores[static_cast<std::size_t>(j)] = dot * static_cast<Compute>(g.scale);
        largest = std::max(largest, scores[static_cast<std::size_t>(j)]);
      }
      Compute total = 0;
      std::fill(sum.begin(), sum.end(), Compute{0});
      for (std::int64_t j = 0; j < keys; ++j) {
        const Compute p = std::exp(scores[static_cast<std::size_t>(j)] - largest);
        total += p;
        const T* v = cache + j * 2 * width + width + h * d;
        for (std::int64_t c = 0; c < d; ++c) sum[static_cast<std::size_t>(c)] += p * load(v[c]);
      }
      for (std::int64_t c = 0; c < d; ++c)
        out[i * width + h * d + c] = store<T>(sum[static_cast<std::size_t>(c)] / total);
    }
  }
}

template <class T>
void run(const AttentionGeometry& g, const TensorView& qkv, void* cache, std::int64_t first, const TensorView& out) {
  const std::int64_t width = g.width();
  T* rows = static_cast<T*>(cache);
  // k and v of the new positions (columns [C, 3C) of their qkv rows) into cache rows [first, first + count)
  for (std::int64_t i = 0; i < qkv.rows; ++i)
    std::memcpy(rows + (first + i) * 2 * width, qkv.as<T>() + i * 3 * width + width,
                static_cast<std::size_t>(2 * width) * sizeof(T));
  cached_attention_typed(g, qkv.as<T>(), qkv.rows, rows, first, out.as<T>());
}

}  // namespace

void cached_attention(const AttentionGeometry& g, const TensorView& qkv, void* cache, std::int64_t first,
                      const TensorView& out) {
  check_cached_attention(g, qkv, first, out);
  switch (qkv.dtype) {
    case DType::f32:
      return run<float>(g, qkv, cache, first, out);
    case DType::f64:
      return run<double>(g, qkv, cache, first, out);
    case DType::bf16:
      return run<bf16>(g, qkv, cache, first, out);
    case DType::f16:
      return run<fp16>(g, qkv, cache, first, out);
  }
  HPCTRAIN_ASSERT(false, "cached attention: dtype " << dtype_name(qkv.dtype));
}

}  // namespace hpctrain::cpu
