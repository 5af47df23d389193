// Matrix products of the CPU backend: oneDNN matmul primitives for f32 and bf16 inputs (f16 inputs are widened to fp32
// first), plain loops for f64. Private to src/kernels/cpu; oneDNN headers stay in the .cpp.
#pragma once

#include <memory>

#include "hpctrain/core/tensor.hpp"

namespace hpctrain::cpu {

class CpuGemm {
 public:
  CpuGemm();
  ~CpuGemm();
  CpuGemm(const CpuGemm&) = delete;
  CpuGemm& operator=(const CpuGemm&) = delete;

  // c = op(a) op(b) [+ bias] [+ c], the contract of Backend::gemm, [+ addend]: (m, n) row-major of c's dtype, not
  // aliasing c, added after the bias before c's one rounding (a residual add; not with accumulate). Primitives are
  // created on the first call of a configuration and cached; scratch buffers only grow, so repeated calls of a shape
  // allocate nothing.
  void run(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
           const void* bias, bool accumulate, const void* addend = nullptr);

  // Number of oneDNN primitives created so far (tests check that repeated shapes reuse them).
  [[nodiscard]] std::size_t cached_primitives() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpctrain::cpu
