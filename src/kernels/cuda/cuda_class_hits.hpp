// Evaluation counts and predict's per-row scores on the CUDA backend (cuda_class_hits.cu). Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

// The contract of Backend::count_class_hits (f32/bf16/f16 scores).
void count_class_hits(cudaStream_t stream, const TensorView& scores, const std::int32_t* targets, double* counts,
                      bool accumulate);
// The contract of Backend::score_targets (f32/bf16/f16 logits).
void score_targets(cudaStream_t stream, const TensorView& logits, const std::int32_t* targets, std::int32_t* argmax,
                   float* target_log_probability);

}  // namespace hpctrain::cuda
