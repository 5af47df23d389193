// The enumerated and structured values of an input deck, as the program uses them. The deck reader (src/config/) turns
// the deck's words into these once; nothing outside src/config/ compares a deck string. Each enumeration's words are
// listed here, in enum order, once: the reader accepts exactly them, to_toml writes them, messages quote them.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

namespace hpctrain {

enum class Device { cpu, cuda, automatic };
enum class LossKind { cross_entropy, mse };
enum class ShuffleMode { global, none, local };
enum class OptimizerKind { adamw, sgd };
enum class ScheduleKind { constant, cosine, step };
enum class PrecisionMode { fp32, bf16, fp16 };
enum class CheckpointSignal { usr1, usr2, term, interrupt, hangup };
// The validation metric that decides the best checkpoint and early stopping (checkpoint.best_metric).
enum class BestMetric { none, loss, accuracy, top5_accuracy, mae, mse, r2 };
// A gelu layer's form (PyTorch's nn.GELU(approximate=...)): the exact erf form, or the tanh approximation (GPT-2's).
enum class GeluApproximation { none, tanh };
// How the model's parameters start (model.init): PyTorch's defaults per layer, or GPT-2's scheme.
enum class InitScheme { pytorch, gpt2 };
// A sequence_pool layer's reduction of (T, C) to (C): the mean over positions, or the first position.
enum class SequencePoolMode { mean, first };
enum class LayerType {
  linear,
  relu,
  gelu,
  tanh,
  leaky_relu,
  layernorm,
  dropout,
  conv2d,
  conv3d,
  maxpool2d,
  maxpool3d,
  avgpool2d,
  avgpool3d,
  global_avgpool,
  flatten,
  groupnorm,
  embedding,
  attention,
  residual,
  transformer_block,
  sequence_pool,
  to_sequence,
};

// The deck's words of an enumeration, indexed by the enum's value.
template <class Choice>
struct ChoiceWords;

#define HPCTRAIN_CHOICE_WORDS(Choice, ...)                                            \
  template <>                                                                         \
  struct ChoiceWords<Choice> {                                                        \
    static constexpr std::array words = std::to_array<std::string_view>(__VA_ARGS__); \
  }

HPCTRAIN_CHOICE_WORDS(Device, {"cpu", "cuda", "auto"});
HPCTRAIN_CHOICE_WORDS(LossKind, {"cross_entropy", "mse"});
HPCTRAIN_CHOICE_WORDS(ShuffleMode, {"global", "none", "local"});
HPCTRAIN_CHOICE_WORDS(OptimizerKind, {"adamw", "sgd"});
HPCTRAIN_CHOICE_WORDS(ScheduleKind, {"constant", "cosine", "step"});
HPCTRAIN_CHOICE_WORDS(PrecisionMode, {"fp32", "bf16", "fp16"});
HPCTRAIN_CHOICE_WORDS(CheckpointSignal, {"USR1", "USR2", "TERM", "INT", "HUP"});
HPCTRAIN_CHOICE_WORDS(BestMetric, {"none", "loss", "accuracy", "top5_accuracy", "mae", "mse", "r2"});
HPCTRAIN_CHOICE_WORDS(GeluApproximation, {"none", "tanh"});
HPCTRAIN_CHOICE_WORDS(InitScheme, {"pytorch", "gpt2"});
HPCTRAIN_CHOICE_WORDS(SequencePoolMode, {"mean", "first"});
// clang-format off
HPCTRAIN_CHOICE_WORDS(LayerType, {"linear", "relu", "gelu", "tanh", "leaky_relu", "layernorm", "dropout", "conv2d",
                                  "conv3d", "maxpool2d", "maxpool3d", "avgpool2d", "avgpool3d", "global_avgpool",
                                  "flatten", "groupnorm", "embedding", "attention", "residual", "transformer_block",
                                  "sequence_pool", "to_sequence"});
// clang-format on
#undef HPCTRAIN_CHOICE_WORDS

template <class Choice>
constexpr std::span<const std::string_view> choice_words() {
  return ChoiceWords<Choice>::words;
}

// The deck's word for a value ("bf16", "conv2d", "USR1").
template <class Choice>
constexpr std::string_view word_of(Choice value) {
  return ChoiceWords<Choice>::words[static_cast<std::size_t>(value)];
}

// The value a deck word names, if it names one (the deck reader's lookup; tests build configs with it).
template <class Choice>
constexpr std::optional<Choice> choice_named(std::string_view word) {
  const auto words = choice_words<Choice>();
  for (std::size_t index = 0; index < words.size(); ++index)
    if (words[index] == word) return static_cast<Choice>(index);
  return std::nullopt;
}

// ---- layer kinds ----
constexpr bool is_convolution(LayerType type) { return type == LayerType::conv2d || type == LayerType::conv3d; }
// Max or average pooling over windows (global_avgpool averages whole samples and has no window).
constexpr bool is_window_pooling(LayerType type) {
  return type == LayerType::maxpool2d || type == LayerType::maxpool3d || type == LayerType::avgpool2d ||
         type == LayerType::avgpool3d;
}
constexpr bool is_max_pooling(LayerType type) { return type == LayerType::maxpool2d || type == LayerType::maxpool3d; }
// Spatial axes of a windowed layer (2 or 3), 0 for the others.
constexpr int window_axes(LayerType type) {
  switch (type) {
    case LayerType::conv2d:
    case LayerType::maxpool2d:
    case LayerType::avgpool2d:
      return 2;
    case LayerType::conv3d:
    case LayerType::maxpool3d:
    case LayerType::avgpool3d:
      return 3;
    default:
      return 0;
  }
}

// ---- precision.loss_scale ----
struct AutoLossScale {  // dynamic for fp16, none otherwise
  bool operator==(const AutoLossScale&) const = default;
};
struct DynamicLossScale {  // PyTorch's GradScaler: grows and backs off
  bool operator==(const DynamicLossScale&) const = default;
};
struct NoLossScale {
  bool operator==(const NoLossScale&) const = default;
};
struct FixedLossScale {  // a constant scale
  double value = 1.0;
  bool operator==(const FixedLossScale&) const = default;
};
using LossScaleSetting = std::variant<AutoLossScale, DynamicLossScale, NoLossScale, FixedLossScale>;

// ---- train.time_limit ----
struct TimeLimit {
  double seconds = 0.0;  // 0: no limit
  std::string text;      // as the deck wrote it ("11:50:00"), for messages and the resolved deck
  [[nodiscard]] bool set() const { return seconds > 0.0; }
  bool operator==(const TimeLimit&) const = default;
};

}  // namespace hpctrain
