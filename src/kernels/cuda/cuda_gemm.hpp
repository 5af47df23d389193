// Matrix products of the CUDA backend through cuBLASLt. Private to src/kernels/cuda.
//
// Row-major products are computed as column-major ones with the operands swapped: C (m, n) row-major is C^T (n, m)
// column-major, and C^T = op(B)^T op(A)^T, so cuBLASLt's "A" is our b and its "B" is our a, with no copies.
// Inputs f32, bf16 or f16 (a and b of one dtype), fp32 accumulation; the output c is the input dtype or f32. f32
// inputs compute in fp32 (CUBLAS_COMPUTE_32F), or TF32 when allowed. The bias epilogue adds a bias of c's dtype (the
// backend converts the fp32 master bias first); accumulation is beta = 1 with C = D.
// A plan (descriptors and the heuristic's best algorithm) is made once per shape, dtypes, epilogue and operand
// alignment, and cached; the workspace is allocated once. Operands whose alignment no algorithm accepts are staged
// through aligned copies (grow-only buffers that retire instead of freeing: a captured graph may point at them).
// A linear layer's weight gradient can carry its bias gradient in the epilogue (CUBLASLT_EPILOGUE_BGRADB), its
// forward the activation after it (RELU/GELU epilogues), and the input gradient of the next linear layer that
// activation's derivative (DRELU/DGELU, reading the mask or pre-activation the forward wrote).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "cuda_memory.hpp"
#include "hpctrain/core/tensor.hpp"

namespace hpctrain::cuda {

class CudaGemm {
 public:
  // The product's epilogue (each a cuBLASLt one, see cublas_epilogue in cuda_gemm.cpp).
  enum class Epilogue : std::uint8_t {
    none,
    bias,
    bias_gradient,
    relu,
    relu_bias,
    relu_aux,
    relu_aux_bias,
    gelu_aux,
    gelu_aux_bias,
    drelu,
    dgelu,
  };
  CudaGemm(cudaStream_t stream, bool allow_tf32);
  ~CudaGemm();
  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;

  // c = op(a) op(b) [+ bias] [+ c]; bias: device vector of c.cols elements in c's dtype, 16-byte aligned, or null.
  void run(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
           const void* bias, bool accumulate);
  // c = a^T b (overwritten) and bias_gradient = column sums of a (c's dtype, c.rows elements), in one product: a
  // linear layer's dW = dy^T x with db. False (nothing done) when cuBLASLt has no such algorithm or an operand is
  // misaligned: the caller then runs the two separately.
  bool run_with_bias_gradient(const TensorView& a, const TensorView& b, const TensorView& c, void* bias_gradient);
  // c = f(a b^T [+ bias]) in one product, a linear layer and the activation after it: epilogue relu, relu_bias
  // (RELU[_BIAS]), relu_aux, relu_aux_bias (RELU_AUX[_BIAS]: f's bit mask into aux), gelu_aux, gelu_aux_bias
  // (GELU_AUX[_BIAS], the tanh form: f's input into aux, c's dtype); aux_ld: bits (mask) or elements (gelu input)
  // per row of c (see linear_epilogue.hpp). False (nothing done) when an operand is misaligned or cuBLASLt has no
  // algorithm for it.
  bool run_activated(const TensorView& a, const TensorView& b, const TensorView& c, const void* bias, Epilogue epilogue,
                     void* aux, std::int64_t aux_ld);
  // c = (a b) * f'(pre) (overwritten), the activation's backward in the input-gradient product of the linear layer
  // after it: epilogue drelu (DRELU, aux: the forward's mask) or dgelu (DGELU, aux: the forward's gelu input).
  // False (nothing done) as run_activated.
  bool run_with_activation_gradient(const TensorView& a, const TensorView& b, const TensorView& c, Epilogue epilogue,
                                    const void* aux, std::int64_t aux_ld);
  // c = a b^T [+ bias] + addend in one product (cuBLASLt's D = A B + beta C with C = addend, beta = 1, and the bias
  // epilogue): a linear layer ending a residual branch with the block's add. addend: c's shape and dtype, not
  // aliasing c. False (nothing done) when an operand is misaligned or cuBLASLt has no algorithm for it.
  bool run_with_addend(const TensorView& a, const TensorView& b, const TensorView& c, const void* bias,
                       const void* addend);
  // TF32 tensor cores for f32 inputs (precision.tf32); plans made before are dropped.
  void allow_tf32(bool allowed);

  struct Key {
    std::int64_t m = 0, n = 0, k = 0;
    bool transpose_a = false, transpose_b = false, accumulate = false;
    Epilogue epilogue = Epilogue::none;
    DType input = DType::f32, output = DType::f32;
    std::uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0, align_aux = 0;
    std::int64_t aux_ld = 0;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };
  struct Plan;

 private:
  // The cached plan of `key` (made on first use); nullptr-free: a plan with available = false has no algorithm.
  Plan& plan_for(const Key& key, const void* bias, const void* aux = nullptr);
  // The fused-activation products (run_activated, run_with_activation_gradient): c = op(a) op(b) with `epilogue`.
  bool run_fused(const TensorView& a, bool transpose_b, const TensorView& b, const TensorView& c, const void* bias,
                 Epilogue epilogue, const void* aux, std::int64_t aux_ld);
  // D = c; C = addend when given (beta = 1), else c when accumulating.
  void execute(Plan& plan, const TensorView& a, const TensorView& b, const TensorView& c, bool accumulate,
               const void* addend = nullptr);
  void run_staged(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
                  const void* bias, bool accumulate);
  DeviceScratch staging_[3];  // a, b, c copies for operands no algorithm accepts
  cudaStream_t stream_;
  bool allow_tf32_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace hpctrain::cuda
