// Row kernels of the CUDA backend: layernorm and the losses, a warp per row (layernorm rows too long or too few for
// that go through cuda_normalization's segmented kernels). Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_memory.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

// Scratch the row kernels share: per-row loss results, reduction partials.
struct RowScratch {
  DeviceScratch row_results;  // (rows, 2) per-row loss and correct flag
  DeviceScratch partials;     // column-sum and segment partials
};

void layernorm_forward(cudaStream_t stream, RowScratch& scratch, const TensorView& x, const float* gamma,
                       const float* beta, float eps, const TensorView& y, float* mean, float* rstd);
void layernorm_backward(cudaStream_t stream, RowScratch& scratch, const TensorView& x, const TensorView& dy,
                        const float* gamma, const float* mean, const float* rstd, const TensorView& dx, float* dgamma,
                        float* dbeta, bool accumulate);
// dbias[j] (+)= sum_i dy[i][j] (two-pass column sums).
void bias_gradient(cudaStream_t stream, RowScratch& scratch, const TensorView& dy, float* dbias, bool accumulate);
// Column sums over rows of a channels-last (rows, spatial, channels) layout: dbias[c] (+)= sum over rows and positions.
void channels_last_sums(cudaStream_t stream, RowScratch& scratch, const TensorView& dy, std::int64_t channels,
                        float* dbias, bool accumulate);
void softmax_cross_entropy(cudaStream_t stream, RowScratch& scratch, const TensorView& logits,
                           const std::int32_t* labels, const float* grad_scale, const TensorView& dlogits,
                           LossSums* sums);
// With class weights and label smoothing (kernel_math::smoothed_cross_entropy_loss per row).
void smoothed_softmax_cross_entropy(cudaStream_t stream, RowScratch& scratch, const TensorView& logits,
                                    const std::int32_t* labels, const CrossEntropyOptions& options,
                                    const float* grad_scale, const TensorView& dlogits, LossSums* sums);
void mean_squared_error(cudaStream_t stream, RowScratch& scratch, const TensorView& pred, const float* targets,
                        const float* grad_scale, const TensorView& dpred, LossSums* sums);

}  // namespace hpctrain::cuda
