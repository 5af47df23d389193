// Element-wise kernels of the CUDA backend: casts, activations, dropout. Private to src/kernels/cuda.
// Thin loops around the per-element functions of kernels/math.hpp; 16 bytes per thread and access when aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

// destination = source element-wise, converting dtypes (f32/bf16/f16; same element count).
void cast(cudaStream_t stream, const TensorView& source, const TensorView& destination);
// out[0, count) = bias converted to `dtype` (the cuBLASLt bias epilogue wants the output's dtype).
void cast_from_float(cudaStream_t stream, const float* in, std::int64_t count, DType dtype, void* out);
void activation_forward(cudaStream_t stream, Activation kind, float alpha, const TensorView& x, const TensorView& y);
// dx = f'(x) * dy; dx may alias dy.
void activation_backward(cudaStream_t stream, Activation kind, float alpha, const TensorView& x, const TensorView& dy,
                         const TensorView& dx);
// sum = a + b in fp32, rounded once; sum may alias a or b.
void add(cudaStream_t stream, const TensorView& a, const TensorView& b, const TensorView& sum);
// out = in * keep / (1 - p) with the CPU backend's mask (key from kernel_math::dropout_key); out may alias in.
void dropout(cudaStream_t stream, float p, std::uint64_t key, std::uint32_t layer, const std::int64_t* sample_ids,
             const TensorView& in, const TensorView& out);

}  // namespace hpctrain::cuda
