// Default implementations of the Backend operations that not every backend has yet: they throw NotSupported naming the
// operation and the backend, so a backend without them still builds and fails clearly when a deck needs them. Fused
// operations default to the plain ones they fuse, in the same order (so a backend without the fusion computes the
// same).
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

namespace {
[[noreturn]] void not_supported(const Backend& backend, const char* operation) {
  throw NotSupported(std::string(operation) + " is not supported on the " + backend.name() + " backend yet");
}
}  // namespace

void Backend::smoothed_softmax_cross_entropy(const TensorView&, const std::int32_t*, const CrossEntropyOptions&,
                                             const float*, const TensorView&, LossSums*) {
  not_supported(*this, "cross-entropy with class weights or label smoothing");
}
void Backend::gradient_chunk_statistics(const float*, std::int64_t, std::span<const ElementRange>, double*) {
  not_supported(*this, "the sharded optimizer's gradient statistics");
}
void Backend::statistics_from_chunks(const double*, std::int64_t, const OptimizerHyper&, StepScalars*) {
  not_supported(*this, "the sharded optimizer's gradient statistics");
}
void Backend::count_class_hits(const TensorView&, const std::int32_t*, double*, bool) {
  not_supported(*this, "counting class hits (evaluation)");
}
void Backend::score_targets(const TensorView&, const std::int32_t*, std::int32_t*, float*) {
  not_supported(*this, "scoring targets (predict)");
}
void Backend::add(const TensorView&, const TensorView&, const TensorView&) {
  not_supported(*this, "the element-wise sum (residual blocks)");
}
void Backend::attention_forward(const AttentionGeometry&, const TensorView&, const TensorView&, void*) {
  not_supported(*this, "attention");
}
void Backend::attention_backward(const AttentionGeometry&, const TensorView&, const TensorView&, const TensorView&,
                                 const void*, const TensorView&) {
  not_supported(*this, "attention");
}
void Backend::cached_attention(const AttentionGeometry&, const TensorView&, void*, std::int64_t, const TensorView&) {
  not_supported(*this, "cached attention (incremental decoding)");
}
void Backend::embedding_forward(const std::int32_t*, const void*, std::int64_t, const TensorView&, const void*,
                                std::int64_t) {
  not_supported(*this, "embedding");
}
void Backend::embedding_backward(const std::int32_t*, const TensorView&, std::int64_t, void*, bool) {
  not_supported(*this, "embedding");
}
void Backend::sequence_pool_forward(SequencePooling, std::int64_t, const TensorView&, const TensorView&) {
  not_supported(*this, "sequence pooling");
}
void Backend::sequence_pool_backward(SequencePooling, std::int64_t, const TensorView&, const TensorView&) {
  not_supported(*this, "sequence pooling");
}
void Backend::to_sequence_forward(std::int64_t, SpatialLayout, const TensorView&, const void*, const void*,
                                  const TensorView&) {
  not_supported(*this, "to_sequence");
}
void Backend::to_sequence_backward(std::int64_t, SpatialLayout, const TensorView&, const TensorView&, void*, void*,
                                   bool) {
  not_supported(*this, "to_sequence");
}
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
void Backend::begin_capture(CaptureSlot) { not_supported(*this, "graph capture"); }
void Backend::end_capture(CaptureSlot) { not_supported(*this, "graph capture"); }
void Backend::replay_capture(CaptureSlot) { not_supported(*this, "graph replay"); }
void Backend::upload_cast(const float*, const TensorView&) { not_supported(*this, "batch uploads"); }
void Backend::copy_to_slot(void*, std::size_t, const std::int32_t*, const void*, std::size_t) {
  not_supported(*this, "slot-indexed copies");
}
void Backend::copy_from_slot(void*, const void*, std::size_t, const std::int32_t*, std::size_t) {
  not_supported(*this, "slot-indexed copies");
}
void Backend::advance_slot(std::int32_t*) { not_supported(*this, "slot-indexed copies"); }

void Backend::linear_weight_gradient(const TensorView& dy, const TensorView& x, const TensorView& dweight, void* dbias,
                                     bool accumulate) {
  gemm(dy, true, x, false, dweight, nullptr, accumulate);
  if (dbias != nullptr) bias_gradient(dy, dbias, dweight.dtype, accumulate);
}

void Backend::linear_activation_forward(const TensorView& x, const TensorView& weight, const void* bias,
                                        Activation kind, float alpha, const TensorView& pre, const TensorView& y) {
  gemm(x, false, weight, true, pre, bias, false);
  activation_forward(kind, alpha, pre, y);
}

void Backend::linear_residual_forward(const TensorView& x, const TensorView& weight, const void* bias,
                                      const TensorView& skip, const TensorView& y) {
  gemm(x, false, weight, true, y, bias, false);
  add(y, skip, y);
}

void Backend::linear_activation_backward(const TensorView& dy, const TensorView& weight, Activation kind, float alpha,
                                         const TensorView& pre, const TensorView& y, const TensorView& dx) {
  gemm(dy, false, weight, false, dx, nullptr, false);
  // relu's derivative from its output (exact, and the one input a fused forward always leaves valid).
  activation_backward(kind, alpha, kind == Activation::relu ? y : pre, dx, dx);
}

}  // namespace hpctrain
