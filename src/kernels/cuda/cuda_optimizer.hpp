// Optimizer-side kernels of the CUDA backend: gradient statistics, the fused AdamW/SGD pass, the loss-scaler update,
// the loss-gradient scale, and the step bookkeeping a captured graph replays (slot-indexed copies of the step's
// records and learning rate, driven by a counter in device memory). Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda_memory.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

void gradient_statistics(cudaStream_t stream, DeviceScratch& scratch, const float* gradients, std::int64_t count,
                         const OptimizerHyper& hyper, StepScalars* scalars);
void optimizer_step(cudaStream_t stream, const OptimizerHyper& hyper, bool decay, float* parameters,
                    const float* gradients, float* state1, float* state2, std::int64_t count, const TensorView& working,
                    const StepScalars* scalars);
void finish_step(cudaStream_t stream, const LossScalerConfig& config, StepScalars* scalars);
void loss_gradient_scale(cudaStream_t stream, const StepScalars* scalars, float rows, const float* label_weights,
                         float* grad_scale);

// base + *slot * stride <- source (bytes), and the reverse; *slot += 1. For step records and learning-rate tables.
void copy_to_slot(cudaStream_t stream, void* base, std::size_t stride, const std::int32_t* slot, const void* source,
                  std::size_t bytes);
void copy_from_slot(cudaStream_t stream, void* destination, const void* base, std::size_t stride,
                    const std::int32_t* slot, std::size_t bytes);
void advance_slot(cudaStream_t stream, std::int32_t* slot);

}  // namespace hpctrain::cuda
