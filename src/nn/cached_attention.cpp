// One-query attention over a key/value cache, for incremental decoding (hpctrain generate) on host memory: each new
// position's query attends to the cached keys and values of itself and every earlier position. A plain host loop (a
// few positions per call, O(T * C) each): the CUDA backend has no such kernel yet, and its attention layers decode by
// recomputing the window (see docs/design.md, Generation and incremental decoding). Decoding is inference: an
// attention's dropout never applies here (a geometry that asks for it is refused rather than silently ignored).
#include <algorithm>
#include <cmath>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/half.hpp"
#include "layer_internal.hpp"

namespace hpctrain::nn_detail {

namespace {

// Scores, softmax and the weighted values in the compute type of T (fp32; fp64 for f64), as the fused kernel.
template <class T>
void cached_attention_typed(const AttentionGeometry& g, const T* qkv, std::int64_t count, const T* cache,
                            std::int64_t first, T* out) {
  using Compute = compute_t<T>;
  const std::int64_t width = g.width(), d = g.head_dim;
  std::vector<Compute> scores(static_cast<std::size_t>(first + count)), sum(static_cast<std::size_t>(d));
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t keys = first + i + 1;  // causal: positions [0, first + i]
    const T* q = qkv + i * 3 * width;         // (3C) row: q, k, v
    for (std::int64_t h = 0; h < g.heads; ++h) {
      Compute largest = -INFINITY;
      for (std::int64_t j = 0; j < keys; ++j) {
        const T* k = cache + j * 2 * width + h * d;  // (2C) cache row: k, v
        Compute dot = 0;
        for (std::int64_t c = 0; c < d; ++c) dot += load(q[h * d + c]) * load(k[c]);
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

}  // namespace

void cached_attention(const AttentionGeometry& geometry, const TensorView& qkv, const void* cache, std::int64_t first,
                      const TensorView& out) {
  HPCTRAIN_ASSERT(geometry.causal && qkv.cols == 3 * geometry.width() && out.cols == geometry.width() &&
                      out.rows == qkv.rows && out.dtype == qkv.dtype,
                  "cached attention: qkv (" << qkv.rows << ", " << qkv.cols << "), out (" << out.rows << ", "
                                            << out.cols << "), width " << geometry.width());
  HPCTRAIN_ASSERT(!geometry.dropout.active(), "cached attention is inference: no dropout");
  switch (qkv.dtype) {
    case DType::f32:
      return cached_attention_typed(geometry, qkv.as<float>(), qkv.rows, static_cast<const float*>(cache), first,
                                    out.as<float>());
    case DType::f64:
      return cached_attention_typed(geometry, qkv.as<double>(), qkv.rows, static_cast<const double*>(cache), first,
                                    out.as<double>());
    case DType::bf16:
      return cached_attention_typed(geometry, qkv.as<bf16>(), qkv.rows, static_cast<const bf16*>(cache), first,
                                    out.as<bf16>());
    case DType::f16:
      return cached_attention_typed(geometry, qkv.as<fp16>(), qkv.rows, static_cast<const fp16*>(cache), first,
                                    out.as<fp16>());
  }
  HPCTRAIN_ASSERT(false, "cached attention: dtype " << dtype_name(qkv.dtype));
}

}  // namespace hpctrain::nn_detail
