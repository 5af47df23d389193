// The loss scaler: settings from the deck, the scalars in backend memory, the divergence policy.
#include "hpctrain/precision/loss_scaler.hpp"

#include <cstddef>
#include <string>
#include <type_traits>
#include <variant>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"

namespace hpctrain {

LossScaler::LossScaler(const PrecisionSection& precision, Backend& backend)
    : backend_(backend),
      mode_(precision.mode),
      max_skipped_steps_(precision.max_skipped_steps),
      scalars_(backend, sizeof(StepScalars)) {
  config_.growth_factor = static_cast<float>(precision.growth_factor);
  config_.backoff_factor = static_cast<float>(precision.backoff_factor);
  config_.growth_interval = static_cast<std::int32_t>(precision.growth_interval);
  std::visit(
      [&](const auto& setting) {
        using Setting = std::decay_t<decltype(setting)>;
        const bool dynamic = std::is_same_v<Setting, DynamicLossScale> ||
                             (std::is_same_v<Setting, AutoLossScale> && precision.mode == PrecisionMode::fp16);
        if (dynamic) {
          config_.enabled = true;
          config_.dynamic = true;
          initial_scale_ = static_cast<float>(precision.init_scale);
        } else if constexpr (std::is_same_v<Setting, FixedLossScale>) {
          config_.enabled = true;
          config_.dynamic = false;
          initial_scale_ = static_cast<float>(setting.value);
        }
      },
      precision.loss_scale);
  StepScalars initial;
  initial.loss_scale = initial_scale_;
  restore(initial);
}

void LossScaler::set_learning_rate(float learning_rate) {
  backend_.copy_to_backend(scalars_.as<char>() + offsetof(StepScalars, learning_rate), &learning_rate,
                           sizeof learning_rate);
}

void LossScaler::begin_step(float global_rows, const float* label_weights, float* gradient_scale) {
  backend_.loss_gradient_scale(device(), global_rows, label_weights, gradient_scale);
}

void LossScaler::finish_step() { backend_.finish_step(config_, device()); }

StepScalars LossScaler::read() const {
  StepScalars host;
  backend_.copy_to_host(&host, scalars_.data, sizeof host);
  return host;
}

void LossScaler::restore(StepScalars saved) {
  saved.found_nonfinite = 0;  // a flag of the step that wrote it, not of the next one
  backend_.copy_to_backend(scalars_.data, &saved, sizeof saved);
}

void LossScaler::check(const StepScalars& after_step, std::int64_t step, double train_loss) const {
  if (after_step.found_nonfinite && !config_.enabled)
    throw NumericsError("the loss or the gradients became NaN/Inf at step " + std::to_string(step) + " (" +
                            std::string(word_of(mode_)) + ", loss " + number_text(train_loss) +
                            "); the run stopped before applying them (metrics.h5 keeps the steps so far)",
                        "lower optimizer.lr, set optimizer.grad_clip, or check the data for extreme values");
  if (config_.enabled && after_step.consecutive_skips > max_skipped_steps_)
    throw NumericsError("the loss scale collapsed: " + std::to_string(after_step.consecutive_skips) +
                            " steps in a row had non-finite gradients (last at step " + std::to_string(step) +
                            ", scale now " + number_text(after_step.loss_scale) + ")",
                        "the model diverged; lower optimizer.lr or try precision.mode = \"bf16\"");
}

}  // namespace hpctrain
