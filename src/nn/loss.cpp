// Cross-entropy and MSE through the backend's fused loss kernels.
#include "hpctrain/nn/loss.hpp"

namespace hpctrain {

Loss::Loss(LossKind kind, Backend& backend, std::int64_t max_rows, std::int64_t outputs)
    : kind_(kind), backend_(backend), outputs_(outputs), answers_(backend, answer_bytes(max_rows)) {}

std::size_t Loss::answer_bytes(std::int64_t rows) const {
  return kind_ == LossKind::cross_entropy ? static_cast<std::size_t>(rows) * sizeof(std::int32_t)
                                          : static_cast<std::size_t>(rows * outputs_) * sizeof(float);
}

void Loss::apply(const TensorView& output, const float* gradient_scale, LossSums* sums) const {
  TensorView gradient = output;
  if (gradient_scale == nullptr) gradient.data = nullptr;
  switch (kind_) {
    case LossKind::cross_entropy:
      backend_.softmax_cross_entropy(output, answers_.as<std::int32_t>(), gradient_scale, gradient, sums);
      return;
    case LossKind::mse:
      backend_.mean_squared_error(output, answers_.data, gradient_scale, gradient, sums);
      return;
  }
}

}  // namespace hpctrain
