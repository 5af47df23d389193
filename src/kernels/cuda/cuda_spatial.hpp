// Convolutional-network operations of the CUDA backend. Private to src/kernels/cuda.
//
// - Convolutions (cuda_convolution.cu): cuDNN's convolution API on the plain NCHW / NCDHW rows and PyTorch-shaped
//   (out, in/groups, k...) weights, fp32 compute. A plan (descriptors, the heuristic's algorithm, its workspace size)
//   is made on the first call of a (geometry, rows, dtype, pass) and cached, as the CPU backend's primitive cache; the
//   workspace and the staging buffers are grow-only and reach their size during the warm-up steps.
// - Pooling and group normalisation (cuda_spatial.cu, cuda_normalization.cu): own kernels computing the CPU backend's
//   formulas (src/kernels/cpu/cpu_spatial.cpp): the same max-pool tie rule (first maximum, NaN wins), average pooling
//   dividing by the whole kernel size, fp32 statistics, fixed-order two-pass reductions.
// Storage f32/bf16/f16; fp64 is NotSupported (the caller's dispatch refuses it first).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_memory.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

// Whether this build has the cuDNN convolutions (HPCTRAIN_HAVE_CUDNN).
bool have_convolutions();

class CudaConvolution {
 public:
  explicit CudaConvolution(cudaStream_t stream);
  ~CudaConvolution();
  CudaConvolution(const CudaConvolution&) = delete;
  CudaConvolution& operator=(const CudaConvolution&) = delete;

  void forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& weight, const void* bias,
               const TensorView& y);
  void backward_data(const SpatialGeometry& geometry, const TensorView& dy, const TensorView& weight,
                     const TensorView& dx);
  void backward_weights(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                        const TensorView& dweight, void* dbias, bool accumulate);
  [[nodiscard]] std::size_t cached_plans() const;
  // The algorithm choices made since the last call, one line each (for the log).
  std::vector<std::string> take_notes();
  // precision.tf32: tensor-core math for f32 convolutions; plans made before are dropped.
  void allow_tf32(bool allowed);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Pooling in the geometry's layout (channels-first or channels-last). argmax: null, or int32 first maxima (in-plane
// offsets, one per output element in y's layout) kept by max pooling's forward for its backward.
void pooling_forward(cudaStream_t stream, PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x,
                     const TensorView& y, std::int32_t* argmax = nullptr);
void pooling_backward(cudaStream_t stream, PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x,
                      const TensorView& dy, const TensorView& dx, const std::int32_t* argmax = nullptr);
// y row r (b, a) = x row r (a, b) (rows of a x b elements of `dtype`, transposed); accumulate: y += (f32 only, the
// weight gradients). y must not alias x.
void transpose_rows(cudaStream_t stream, std::int64_t rows, std::int64_t a, std::int64_t b, DType dtype, const void* x,
                    void* y, bool accumulate = false);
// Backend::convert_spatial_layout: rows of `channels` channels from layout `from` into the other one.
void convert_spatial_layout(cudaStream_t stream, std::int64_t channels, SpatialLayout from, const TensorView& x,
                            const TensorView& y);
// Either layout (channels-first: contiguous (sample, group) blocks; channels-last: strided runs of a group's channels).
void groupnorm_forward(cudaStream_t stream, DeviceScratch& scratch, std::int64_t channels, std::int64_t groups,
                       SpatialLayout layout, const TensorView& x, const float* gamma, const float* beta, float eps,
                       const TensorView& y, float* mean, float* rstd);
void groupnorm_backward(cudaStream_t stream, DeviceScratch& scratch, std::int64_t channels, std::int64_t groups,
                        SpatialLayout layout, const TensorView& x, const TensorView& dy, const float* gamma,
                        const float* mean, const float* rstd, const TensorView& dx, float* dgamma, float* dbeta,
                        bool accumulate);

}  // namespace hpctrain::cuda
