// The model's loss: softmax cross-entropy on integer class labels (optionally with class weights and label smoothing),
// or mean squared error on real-valued targets. It owns the buffer the batch's answers are uploaded into, and writes
// the loss gradient over the model's output, where the backward pass starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hpctrain/config/choices.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"

namespace hpctrain {

class Loss {
 public:
  // max_rows: the largest batch; outputs: the model's output width. class_weights (empty, or one per output) and
  // label_smoothing: cross-entropy only (model.class_weights, model.label_smoothing; checked by the deck reader and
  // the model).
  Loss(LossKind kind, Backend& backend, std::int64_t max_rows, std::int64_t outputs,
       const std::vector<double>& class_weights = {}, double label_smoothing = 0.0);

  [[nodiscard]] LossKind kind() const { return kind_; }
  // Where a batch's answers go (backend memory): int32 labels, one per row (cross-entropy), or fp32 targets,
  // (rows, outputs) (mse).
  [[nodiscard]] void* answers() const { return answers_.data; }
  [[nodiscard]] std::size_t answer_bytes(std::int64_t rows) const;
  // Whether the cross-entropy has class weights: its mean then divides by the sum of the labels' weights, not rows.
  [[nodiscard]] bool weighted() const { return !class_weights_.empty(); }
  // The denominator of the mean over these labels (host memory): the sum of their classes' weights (in the fp32
  // values the kernels read), or rows without class weights.
  [[nodiscard]] double label_weight_sum(const std::int32_t* labels, std::int64_t rows) const;
  // "cross-entropy with class weights [...] and label smoothing e" for the model summary; "" for the plain losses.
  [[nodiscard]] std::string options_text() const;
  // Targets equal to this are not scored (PyTorch's ignore_index): no loss, no gradient, not counted in the mean.
  static constexpr std::int32_t ignore_index = -100;
  // The mean's denominator over a sequence model's targets: how many are not ignore_index.
  [[nodiscard]] static double counted_targets(const std::int32_t* targets, std::int64_t count);
  // sums += per-sample losses (and, for cross-entropy, correct predictions) of `output` against the answers; with
  // gradient_scale (backend memory) the loss gradient times *gradient_scale is written over `output`. Per-sample
  // losses with class weights are weighted (divide their sum by label_weight_sum for the mean).
  void apply(const TensorView& output, const float* gradient_scale, LossSums* sums) const;

 private:
  LossKind kind_;
  Backend& backend_;
  std::int64_t outputs_;
  BackendBuffer answers_;
  std::vector<float> class_weights_;  // (outputs) or empty
  BackendBuffer device_class_weights_;
  float label_smoothing_ = 0.0f;
};

}  // namespace hpctrain
