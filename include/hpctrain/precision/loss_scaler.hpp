// Dynamic loss scaling (PyTorch's autocast + GradScaler recipe) on the backend. The scaler owns the step's scalars in
// backend memory (StepScalars: the scale and its growth tracker, the skip flag, the learning rate, the gradient norm
// and clip coefficient the optimizer reads), so a captured CUDA graph replays a whole step without the host:
//   begin_step   the loss gradient's factor, scale / global rows, formed on the backend from the current scale;
//   (the optimizer's gradient statistics flag non-finite all-reduced gradients; its update skips such a step);
//   finish_step  growth after growth_interval finite steps, backoff and a skip count after a non-finite one.
// It also holds the run's divergence policy: a non-finite step without scaling, or too many skipped steps in a row,
// ends the run with a clear message. The per-element arithmetic is shared with the CUDA kernels (kernels/math.hpp).
#pragma once

#include <cstdint>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"

namespace hpctrain {

class LossScaler {
 public:
  // precision.loss_scale: auto (dynamic for fp16, none otherwise), dynamic, none or a fixed value.
  LossScaler(const PrecisionSection& precision, Backend& backend);

  [[nodiscard]] bool enabled() const { return config_.enabled; }
  [[nodiscard]] const LossScalerConfig& config() const { return config_; }
  // The scalars in backend memory (the optimizer's gradient statistics and update read and write them).
  [[nodiscard]] StepScalars* device() const { return scalars_.as<StepScalars>(); }

  // The learning rate of the next step (written from the host before the step).
  void set_learning_rate(float learning_rate);
  // *gradient_scale (backend memory) = loss scale / global_rows, or / *label_weights (backend memory: the global
  // batch's sum of its labels' class weights) when that is not null.
  void begin_step(float global_rows, const float* label_weights, float* gradient_scale);
  // Growth or backoff after the optimizer has run; consecutive skips counted.
  void finish_step();

  // Host copy of the scalars (for the log and checkpoints), and restoring them from a checkpoint.
  [[nodiscard]] StepScalars read() const;
  void restore(StepScalars saved);
  [[nodiscard]] float initial_scale() const { return initial_scale_; }

  // Throws NumericsError when a step (1-based `step`, its loss `train_loss`) went non-finite without scaling, or the
  // scale collapsed: more than precision.max_skipped_steps skipped steps in a row.
  void check(const StepScalars& after_step, std::int64_t step, double train_loss) const;

 private:
  Backend& backend_;
  LossScalerConfig config_;
  float initial_scale_ = 1.0f;
  PrecisionMode mode_;
  std::int64_t max_skipped_steps_;
  BackendBuffer scalars_;
};

}  // namespace hpctrain
