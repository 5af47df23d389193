// Sequence kernels of the CUDA backend: fused attention (forward, backward), the embedding lookup (forward, backward)
// and sequence pooling, with the contracts of Backend::attention_*, Backend::embedding_* and
// Backend::sequence_pool_*. Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_memory.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

// Scratch of the sequence kernels.
struct SequenceScratch {
  DeviceScratch delta;  // attention backward: (batch, heads, sequence) D_i = rowsum(dO_i * O_i)
  DeviceScratch sort;   // embedding backward: the ids sorted with their rows, and the radix sort's temporary storage
};

// lse: (batch, heads, sequence) f32.
void attention_forward(cudaStream_t stream, const AttentionGeometry& geometry, const TensorView& qkv,
                       const TensorView& out, float* lse);
void attention_backward(cudaStream_t stream, SequenceScratch& scratch, const AttentionGeometry& geometry,
                        const TensorView& qkv, const TensorView& out, const TensorView& dout, const float* lse,
                        const TensorView& dqkv);
// table, dtable: f32 (vocabulary, y.cols); positions: null or f32 (sequence, y.cols) (Backend::embedding_forward).
void embedding_forward(cudaStream_t stream, const std::int32_t* ids, const float* table, std::int64_t vocabulary,
                       const TensorView& y, const float* positions = nullptr, std::int64_t sequence = 0);
void embedding_backward(cudaStream_t stream, SequenceScratch& scratch, const std::int32_t* ids, const TensorView& dy,
                        std::int64_t vocabulary, float* dtable, bool accumulate);

void sequence_pool_forward(cudaStream_t stream, SequencePooling mode, std::int64_t sequence, const TensorView& x,
                           const TensorView& y);
void sequence_pool_backward(cudaStream_t stream, SequencePooling mode, std::int64_t sequence, const TensorView& dy,
                            const TensorView& dx);

}  // namespace hpctrain::cuda
