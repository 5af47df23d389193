// Matrix products of the CUDA backend through cuBLASLt. Private to src/kernels/cuda.
//
// Row-major products are computed as column-major ones with the operands swapped: C (m, n) row-major is C^T (n, m)
// column-major, and C^T = op(B)^T op(A)^T, so cuBLASLt's "A" is our b and its "B" is our a, with no copies.
// Inputs f32, bf16 or f16 (a and b of one dtype), fp32 accumulation; the output c is the input dtype or f32. f32
// inputs compute in fp32 (CUBLAS_COMPUTE_32F), or TF32 when allowed. The bias epilogue adds a bias of c's dtype (the
// backend converts the fp32 master bias first); accumulation is beta = 1 with C = D.
// A plan (descriptors and the heuristic's best algorithm) is made once per shape, dtypes, epilogue and operand
// alignment, and cached; the workspace is allocated once. Operands whose alignment no algorithm accepts are staged
// through aligned copies.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "hpctrain/core/tensor.hpp"

namespace hpctrain::cuda {

class CudaGemm {
 public:
  CudaGemm(cudaStream_t stream, bool allow_tf32);
  ~CudaGemm();
  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;

  // c = op(a) op(b) [+ bias] [+ c]; bias: device vector of c.cols elements in c's dtype, 16-byte aligned, or null.
  void run(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
           const void* bias, bool accumulate);

  struct Key {
    std::int64_t m = 0, n = 0, k = 0;
    bool transpose_a = false, transpose_b = false, bias = false, accumulate = false;
    DType input = DType::f32, output = DType::f32;
    std::uint32_t align_a = 0, align_b = 0, align_c = 0;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };
  struct Plan;

 private:
  void run_staged(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
                  const void* bias, bool accumulate);
  struct Staging {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  Staging staging_[3];  // a, b, c copies for operands no algorithm accepts (grow-only)
  cudaStream_t stream_;
  bool allow_tf32_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace hpctrain::cuda
