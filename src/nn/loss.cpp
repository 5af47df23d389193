// Cross-entropy and MSE through the backend's fused loss kernels.
#include "hpctrain/nn/loss.hpp"

#include <sstream>
#include "hpctrain/kernels/math.hpp"

namespace hpctrain {

Loss::Loss(LossKind kind, Backend& backend, std::int64_t max_rows, std::int64_t outputs,
           const std::vector<double>& class_weights, double label_smoothing)
    : kind_(kind),
      backend_(backend),
      outputs_(outputs),
      answers_(backend, answer_bytes(max_rows)),
      class_weights_(class_weights.begin(), class_weights.end()),
      label_smoothing_(static_cast<float>(label_smoothing)) {
  if (!class_weights_.empty()) {
    device_class_weights_ = BackendBuffer(backend, class_weights_.size() * sizeof(float));
    backend.copy_to_backend(device_class_weights_.data, class_weights_.data(), class_weights_.size() * sizeof(float));
  }
}

std::size_t Loss::answer_bytes(std::int64_t rows) const {
  return kind_ == LossKind::cross_entropy ? static_cast<std::size_t>(rows) * sizeof(std::int32_t)
                                          : static_cast<std::size_t>(rows * outputs_) * sizeof(float);
}

double Loss::label_weight_sum(const std::int32_t* labels, std::int64_t rows) const {
  if (!weighted()) return static_cast<double>(rows);
  double sum = 0.0;
  for (std::int64_t i = 0; i < rows; ++i) sum += class_weights_[static_cast<std::size_t>(labels[i])];
  return sum;
}

std::string Loss::options_text() const {
  if (!weighted() && label_smoothing_ == 0.0f) return "";
  std::ostringstream text;
  text << "cross-entropy";
  if (weighted()) {
    text << " with class weights [";
    for (std::size_t k = 0; k < class_weights_.size(); ++k) text << (k > 0 ? ", " : "") << class_weights_[k];
    text << "]";
  }
  if (label_smoothing_ != 0.0f) text << (weighted() ? " and" : " with") << " label smoothing " << label_smoothing_;
  return text.str();
}

static_assert(Loss::ignore_index == kernel_math::ignored_label);

double Loss::counted_targets(const std::int32_t* targets, std::int64_t count) {
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < count; ++i) counted += targets[i] != ignore_index;
  return static_cast<double>(counted);
}

void Loss::apply(const TensorView& output, const float* gradient_scale, LossSums* sums) const {
  TensorView gradient = output;
  if (gradient_scale == nullptr) gradient.data = nullptr;
  switch (kind_) {
    case LossKind::cross_entropy:
      if (weighted() || label_smoothing_ != 0.0f) {
        const CrossEntropyOptions options{device_class_weights_.as<float>(), label_smoothing_};
        backend_.smoothed_softmax_cross_entropy(output, answers_.as<std::int32_t>(), options, gradient_scale, gradient,
                                                sums);
      } else {  // the plain kernel: results bit-identical to runs before class weights existed
        backend_.softmax_cross_entropy(output, answers_.as<std::int32_t>(), gradient_scale, gradient, sums);
      }
      return;
    case LossKind::mse:
      backend_.mean_squared_error(output, answers_.data, gradient_scale, gradient, sums);
      return;
  }
}

}  // namespace hpctrain
