// Convolutions of the CPU backend: oneDNN 2.6 convolution primitives for f32 and bf16 (f16 widened to fp32 first),
// plain loops in double for f64 (the reference the gradient checks and the oneDNN tests use). Private to
// src/kernels/cpu; oneDNN headers stay in the .cpp.
#pragma once

#include <memory>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cpu {

// Which layouts the oneDNN primitives run on (the caller's buffers are always plain).
enum class ConvolutionLayouts : std::uint8_t {
  preferred,  // oneDNN's preferred layouts (channel-blocked), reordered on the way in and out: what the backend uses
  plain,      // the plain NCHW/NCDHW and (out, in/groups, k...) layouts, no reorders (tests check both)
};

class CpuConvolution {
 public:
  explicit CpuConvolution(ConvolutionLayouts layouts = ConvolutionLayouts::preferred);
  ~CpuConvolution();
  CpuConvolution(const CpuConvolution&) = delete;
  CpuConvolution& operator=(const CpuConvolution&) = delete;

  // The contracts of Backend::convolution_*. A primitive is created on the first call of a (geometry, rows, dtypes)
  // configuration and cached; scratch buffers only grow, so repeated calls allocate nothing.
  void forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& weight, const void* bias,
               const TensorView& y);
  void backward_data(const SpatialGeometry& geometry, const TensorView& dy, const TensorView& weight,
                     const TensorView& dx);
  void backward_weights(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                        const TensorView& dweight, void* dbias, bool accumulate);

  // Number of oneDNN primitives created so far (tests check that repeated shapes reuse them).
  [[nodiscard]] std::size_t cached_primitives() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpctrain::cpu
