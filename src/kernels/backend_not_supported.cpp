// Default implementations of the Backend operations that not every backend has yet: they throw NotSupported naming the
// operation and the backend, so a backend without them still builds and fails clearly when a deck needs them.
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

namespace {
[[noreturn]] void not_supported(const Backend& backend, const char* operation) {
  throw NotSupported(std::string(operation) + " is not supported on the " + backend.name() + " backend yet");
}
}  // namespace

void Backend::convolution_forward(const SpatialGeometry&, const TensorView&, const TensorView&, const void*,
                                  const TensorView&) {
  not_supported(*this, "convolution (conv2d/conv3d)");
}
void Backend::convolution_backward_data(const SpatialGeometry&, const TensorView&, const TensorView&,
                                        const TensorView&) {
  not_supported(*this, "convolution (conv2d/conv3d)");
}
void Backend::convolution_backward_weights(const SpatialGeometry&, const TensorView&, const TensorView&,
                                           const TensorView&, void*, bool) {
  not_supported(*this, "convolution (conv2d/conv3d)");
}
void Backend::pooling_forward(PoolingKind, const SpatialGeometry&, const TensorView&, const TensorView&) {
  not_supported(*this, "pooling (maxpool/avgpool/global_avgpool)");
}
void Backend::pooling_backward(PoolingKind, const SpatialGeometry&, const TensorView&, const TensorView&,
                               const TensorView&) {
  not_supported(*this, "pooling (maxpool/avgpool/global_avgpool)");
}
void Backend::groupnorm_forward(std::int64_t, std::int64_t, SpatialLayout, const TensorView&, const void*, const void*,
                                float, const TensorView&, void*, void*) {
  not_supported(*this, "groupnorm");
}
void Backend::groupnorm_backward(std::int64_t, std::int64_t, SpatialLayout, const TensorView&, const TensorView&,
                                 const void*, const void*, const void*, const TensorView&, void*, void*, bool) {
  not_supported(*this, "groupnorm");
}
void Backend::convert_spatial_layout(std::int64_t, SpatialLayout, const TensorView&, const TensorView&) {
  not_supported(*this, "a channels-last activation layout");
}

}  // namespace hpctrain
