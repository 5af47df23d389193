// Optimizer-side kernels of the CUDA backend (see cuda_optimizer.hpp).
#include <limits>

#include "cuda_device.cuh"
#include "cuda_dispatch.hpp"
#include "cuda_optimizer.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/math.hpp"

namespace hpctrain::cuda {
namespace {

namespace km = kernel_math;

// Elements per partial sum of the gradient statistics (one block each); partials are added in order.
constexpr std::int64_t statistics_chunk = 4096;

// Per chunk of statistics_chunk gradients: sum of squares (double) and a non-finite flag. One block per chunk.
__global__ void gradient_partials_kernel(const float* gradients, std::int64_t count, double* partial_sums,
                                         int* partial_nonfinite) {
  __shared__ double shared[block_threads];
  __shared__ int any_nonfinite;
  if (threadIdx.x == 0) any_nonfinite = 0;
  __syncthreads();
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * statistics_chunk;
  const std::int64_t end = begin + statistics_chunk < count ? begin + statistics_chunk : count;
  double sum = 0.0;
  bool nonfinite = false;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += block_threads) {
    const float g = gradients[i];
    nonfinite |= !km::is_finite(g);
    sum += static_cast<double>(g) * static_cast<double>(g);
  }
  if (nonfinite) any_nonfinite = 1;   // benign race: every writer writes 1
  sum = block_tree_sum(sum, shared);  // its barriers also publish any_nonfinite
  if (threadIdx.x == 0) {
    partial_sums[blockIdx.x] = sum;
    partial_nonfinite[blockIdx.x] = any_nonfinite;
  }
}

// One block: adds the partials in a fixed order and sets found_nonfinite, grad_norm and clip_coefficient.
__global__ void gradient_statistics_kernel(const double* partial_sums, const int* partial_nonfinite,
                                           std::int64_t chunks, float max_grad_norm, StepScalars* scalars) {
  __shared__ double shared[block_threads];
  double sum = 0.0, nonfinite = 0.0;
  for (std::int64_t chunk = threadIdx.x; chunk < chunks; chunk += block_threads) {
    sum += partial_sums[chunk];
    nonfinite += partial_nonfinite[chunk];
  }
  sum = block_tree_sum(sum, shared);
  nonfinite = block_tree_sum(nonfinite, shared);
  if (threadIdx.x == 0) {
    const bool any_nonfinite = nonfinite > 0.0;
    const double norm = ::sqrt(sum) / static_cast<double>(scalars->loss_scale);
    scalars->found_nonfinite = any_nonfinite ? 1 : 0;
    scalars->grad_norm = static_cast<float>(norm);
    scalars->clip_coefficient = any_nonfinite ? 1.0f : km::clip_coefficient(static_cast<float>(norm), max_grad_norm);
  }
}

// W: the working copy's storage type (written when working is not null).
template <class W>
__global__ void adamw_kernel(float* parameters, const float* gradients, float* first_moment, float* second_moment,
                             std::int64_t count, W* working, float beta1, float beta2, float eps, float weight_decay,
                             const StepScalars* scalars) {
  if (scalars->found_nonfinite) return;
  const float inverse_loss_scale = 1.0f / scalars->loss_scale;
  const float clip = scalars->clip_coefficient;
  const auto constants =
      km::adamw_constants(scalars->learning_rate, beta1, beta2, eps, weight_decay, scalars->applied_steps + 1);
  for (std::int64_t i = global_thread(); i < count; i += grid_threads()) {
    const float g = gradients[i] * inverse_loss_scale * clip;
    float parameter = parameters[i], m = first_moment[i], v = second_moment[i];
    km::adamw_update(parameter, m, v, g, constants);
    parameters[i] = parameter;
    first_moment[i] = m;
    second_moment[i] = v;
    if (working != nullptr) working[i] = convert<W>(parameter);
  }
}

template <class W>
__global__ void sgd_kernel(float* parameters, const float* gradients, float* momentum_buffer, std::int64_t count,
                           W* working, float momentum, bool nesterov, float weight_decay, const StepScalars* scalars) {
  if (scalars->found_nonfinite) return;
  const float inverse_loss_scale = 1.0f / scalars->loss_scale;
  const float clip = scalars->clip_coefficient;
  const float learning_rate = scalars->learning_rate;
  const bool first_step = scalars->applied_steps == 0;
  for (std::int64_t i = global_thread(); i < count; i += grid_threads()) {
    const float g = gradients[i] * inverse_loss_scale * clip;
    float parameter = parameters[i];
    float buffer = momentum_buffer != nullptr ? momentum_buffer[i] : 0.0f;
    km::sgd_update(parameter, buffer, g, learning_rate, momentum, weight_decay, nesterov, first_step);
    parameters[i] = parameter;
    if (momentum_buffer != nullptr) momentum_buffer[i] = buffer;
    if (working != nullptr) working[i] = convert<W>(parameter);
  }
}

__global__ void finish_step_kernel(LossScalerConfig config, StepScalars* scalars) {
  km::update_loss_scale(config, *scalars);
}

__global__ void loss_gradient_scale_kernel(const StepScalars* scalars, float rows, const float* label_weights,
                                           float* grad_scale) {
  *grad_scale = scalars->loss_scale / (label_weights != nullptr ? *label_weights : rows);
}

// A few bytes between a fixed place and slot *slot of a table; one block (records are a few hundred bytes).
__global__ void slot_copy_kernel(char* fixed, char* base, std::size_t stride, const std::int32_t* slot,
                                 std::size_t bytes, bool into_slot) {
  char* entry = base + static_cast<std::size_t>(*slot) * stride;
  for (std::size_t i = threadIdx.x; i < bytes; i += blockDim.x) {
    if (into_slot)
      entry[i] = fixed[i];
    else
      fixed[i] = entry[i];
  }
}

__global__ void advance_slot_kernel(std::int32_t* slot) { *slot += 1; }

}  // namespace

void gradient_statistics(cudaStream_t stream, DeviceScratch& scratch, const float* gradients, std::int64_t count,
                         const OptimizerHyper& hyper, StepScalars* scalars) {
  const std::int64_t chunks = std::max<std::int64_t>((count + statistics_chunk - 1) / statistics_chunk, 1);
  HPCTRAIN_ASSERT(chunks <= std::numeric_limits<int>::max(), "gradient_statistics: " << count << " gradients");
  // (chunks) sums, then (chunks) flags, in one scratch buffer.
  auto* partial_sums = scratch.reserve_elements<double>(static_cast<std::size_t>(2 * chunks));
  auto* partial_nonfinite = reinterpret_cast<int*>(partial_sums + chunks);
  gradient_partials_kernel<<<static_cast<unsigned>(chunks), block_threads, 0, stream>>>(gradients, count, partial_sums,
                                                                                        partial_nonfinite);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
  gradient_statistics_kernel<<<1, block_threads, 0, stream>>>(partial_sums, partial_nonfinite, chunks,
                                                              hyper.max_grad_norm, scalars);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

void optimizer_step(cudaStream_t stream, const OptimizerHyper& hyper, bool decay, float* parameters,
                    const float* gradients, float* state1, float* state2, std::int64_t count, const TensorView& working,
                    const StepScalars* scalars) {
  if (count == 0) return;
  if (working.data != nullptr)
    HPCTRAIN_ASSERT(working.size() == count,
                    "optimizer_step: working copy of " << working.size() << " elements for " << count);
  const float weight_decay = decay ? hyper.weight_decay : 0.0f;
  const DType working_dtype = working.data != nullptr ? working.dtype : DType::f32;
  dispatch_storage(working_dtype, "optimizer_step", [&]<class W>() {
    W* copy = static_cast<W*>(working.data);
    if (hyper.type == OptimizerType::adamw) {
      HPCTRAIN_ASSERT(state1 != nullptr && state2 != nullptr, "AdamW needs both moment buffers");
      adamw_kernel<<<grid_for(count), block_threads, 0, stream>>>(parameters, gradients, state1, state2, count, copy,
                                                                  hyper.beta1, hyper.beta2, hyper.eps, weight_decay,
                                                                  scalars);
    } else {
      HPCTRAIN_ASSERT(hyper.momentum == 0.0f || state1 != nullptr, "SGD with momentum needs a momentum buffer");
      sgd_kernel<<<grid_for(count), block_threads, 0, stream>>>(parameters, gradients,
                                                                hyper.momentum != 0.0f ? state1 : nullptr, count, copy,
                                                                hyper.momentum, hyper.nesterov, weight_decay, scalars);
    }
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void finish_step(cudaStream_t stream, const LossScalerConfig& config, StepScalars* scalars) {
  finish_step_kernel<<<1, 1, 0, stream>>>(config, scalars);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

void loss_gradient_scale(cudaStream_t stream, const StepScalars* scalars, float rows, const float* label_weights,
                         float* grad_scale) {
  loss_gradient_scale_kernel<<<1, 1, 0, stream>>>(scalars, rows, label_weights, grad_scale);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

void copy_to_slot(cudaStream_t stream, void* base, std::size_t stride, const std::int32_t* slot, const void* source,
                  std::size_t bytes) {
  if (bytes == 0) return;
  slot_copy_kernel<<<1, 128, 0, stream>>>(static_cast<char*>(const_cast<void*>(source)), static_cast<char*>(base),
                                          stride, slot, bytes, true);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

void copy_from_slot(cudaStream_t stream, void* destination, const void* base, std::size_t stride,
                    const std::int32_t* slot, std::size_t bytes) {
  if (bytes == 0) return;
  slot_copy_kernel<<<1, 128, 0, stream>>>(static_cast<char*>(destination), static_cast<char*>(const_cast<void*>(base)),
                                          stride, slot, bytes, false);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

void advance_slot(cudaStream_t stream, std::int32_t* slot) {
  advance_slot_kernel<<<1, 1, 0, stream>>>(slot);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace hpctrain::cuda
