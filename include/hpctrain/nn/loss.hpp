// The model's loss: softmax cross-entropy on integer class labels, or mean squared error on real-valued targets. It
// owns the buffer the batch's answers are uploaded into, and writes the loss gradient over the model's output, where
// the backward pass starts.
#pragma once

#include <cstdint>

#include "hpctrain/config/choices.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"

namespace hpctrain {

class Loss {
 public:
  // max_rows: the largest batch; outputs: the model's output width.
  Loss(LossKind kind, Backend& backend, std::int64_t max_rows, std::int64_t outputs);

  [[nodiscard]] LossKind kind() const { return kind_; }
  // Where a batch's answers go (backend memory): int32 labels, one per row (cross-entropy), or fp32 targets,
  // (rows, outputs) (mse).
  [[nodiscard]] void* answers() const { return answers_.data; }
  [[nodiscard]] std::size_t answer_bytes(std::int64_t rows) const;
  // sums += per-sample losses (and, for cross-entropy, correct predictions) of `output` against the answers; with
  // gradient_scale (backend memory) the loss gradient times *gradient_scale is written over `output`.
  void apply(const TensorView& output, const float* gradient_scale, LossSums* sums) const;

 private:
  LossKind kind_;
  Backend& backend_;
  std::int64_t outputs_;
  BackendBuffer answers_;
};

}  // namespace hpctrain
