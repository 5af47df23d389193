// The tensor-core attention kernels of the CUDA backend (bf16/fp16 storage, head_dim 32/64/128): the contract of
// Backend::attention_forward/backward, as the reference kernels of cuda_attention.hpp. The backend calls them only
// for what cuda::choose_attention_kernel (hpctrain/kernels/cuda/attention_plan.hpp) gives them. Private to
// src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include "cuda_attention.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

// lse: (batch, heads, sequence) f32, natural-log units, as attention_forward writes it.
void tensor_core_attention_forward(cudaStream_t stream, const AttentionGeometry& geometry, const TensorView& qkv,
                                   const TensorView& out, float* lse);
void tensor_core_attention_backward(cudaStream_t stream, SequenceScratch& scratch, const AttentionGeometry& geometry,
                                    const TensorView& qkv, const TensorView& out, const TensorView& dout,
                                    const float* lse, const TensorView& dqkv);

}  // namespace hpctrain::cuda
