// Sequence kernels of the CPU backend (transformers): fused multi-head attention in tiles with an online softmax
// (cpu_attention.cpp) and its one-query form over a key/value cache (cpu_cached_attention.cpp), the embedding lookup
// with its deterministic gradient (cpu_embedding.cpp) and the pooling of a sequence into one vector
// (cpu_sequence_pool.cpp), and a conv feature map turned into a sequence (cpu_to_sequence.cpp). Private to
// src/kernels/cpu.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu_common.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cpu {

class CpuAttention {
 public:
  // The contracts of Backend::attention_forward/backward. Every OpenMP thread works in its own scratch (tiles of a
  // query block by a key block, and in the backward one head's queries and gradients): buffers only grow, so repeated
  // calls of a shape allocate nothing.
  void forward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out, void* lse);
  void backward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out, const TensorView& dout,
                const void* lse, const TensorView& dqkv);

 private:
  std::vector<ScratchBuffer>& thread_scratch();
  std::vector<ScratchBuffer> thread_scratch_;  // one per OpenMP thread
};

// The contract of Backend::cached_attention (cpu_cached_attention.cpp).
void cached_attention(const AttentionGeometry& geometry, const TensorView& qkv, void* cache, std::int64_t first,
                      const TensorView& out);

class CpuEmbedding {
 public:
  // The contracts of Backend::embedding_forward/backward.
  void forward(const std::int32_t* ids, const void* table, std::int64_t vocabulary, const TensorView& y,
               const void* positions, std::int64_t sequence);
  void backward(const std::int32_t* ids, const TensorView& dy, std::int64_t vocabulary, void* dtable, bool accumulate);

 private:
  ScratchBuffer rows_by_id_;  // (rows) the rows sorted by id, stably
  ScratchBuffer id_starts_;   // (vocabulary + 1) where each id's rows begin in rows_by_id_
};

// The contracts of Backend::sequence_pool_forward/backward (cpu_sequence_pool.cpp).
void sequence_pool_forward(SequencePooling mode, std::int64_t sequence, const TensorView& x, const TensorView& y);
void sequence_pool_backward(SequencePooling mode, std::int64_t sequence, const TensorView& dy, const TensorView& dx);

// The contracts of Backend::to_sequence_forward/backward (cpu_to_sequence.cpp).
void to_sequence_forward(std::int64_t channels, SpatialLayout layout, const TensorView& x, const void* class_token,
                         const void* positions, const TensorView& y);
void to_sequence_backward(std::int64_t channels, SpatialLayout layout, const TensorView& dy, const TensorView& dx,
                          void* dclass_token, void* dpositions, bool accumulate);

}  // namespace hpctrain::cpu
