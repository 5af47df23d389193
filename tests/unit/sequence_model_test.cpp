// The first sequence model (issue 16) in double precision through the real layer code: an embedding (with a learned
// position embedding) reads token ids,
// linear and layernorm act on the last axis of (T, C) samples, and the loss scores every position against the next
// tokens with ignored targets (-100). The forward pass is compared with a host f64 reference, and the gradient of
// every parameter (the embedding's table included) with central differences of the loss; also through an attention
// layer (causal and not) on sequences of 37 positions, the input's gradient reaching the embedding's tables.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {
namespace {

constexpr std::int64_t rows = 3, positions = 5, vocabulary = 7, width = 4;

LayerSpec layer(LayerType type, std::int64_t out = 0, bool causal = true) {
  LayerSpec spec;
  spec.heads = 2;
  spec.causal = causal;
  spec.type = type;
  spec.name = std::string(word_of(type)) + std::to_string(out);
  spec.out = out;
  spec.vocabulary = vocabulary;
  spec.p = 0.3;
  spec.positions = true;
  return spec;
}

struct Batch {
  std::vector<std::int32_t> ids, targets;  // (rows, T)
  double counted = 0;                      // targets not ignored
};

Batch random_batch(std::int64_t sequence) {
  std::mt19937 generator(5);
  Batch batch;
  for (std::int64_t i = 0; i < rows * sequence; ++i) {
    batch.ids.push_back(static_cast<std::int32_t>(generator() % vocabulary));
    batch.targets.push_back(i % 4 == 3 ? Loss::ignore_index : static_cast<std::int32_t>(generator() % vocabulary));
    batch.counted += batch.targets.back() != Loss::ignore_index;
  }
  return batch;
}

struct SequenceModel {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  Model model;
  Batch batch;
  std::vector<std::int64_t> sample_ids{10, 11, 12};
  StepContext context{backend.get(), true, 5, 2, sample_ids.data(), rows};

  explicit SequenceModel(std::vector<LayerSpec> layers, std::int64_t sequence = positions)
      : model(ModelSection{std::move(layers)}, SampleShape{sequence}, *backend, {DType::f64, DType::f64, rows},
              "test.toml"),
        batch(random_batch(sequence)) {
    model.initialize(3);
    backend->copy_to_backend(model.token_ids(), batch.ids.data(), batch.ids.size() * sizeof(std::int32_t));
    if (model.positions() == 1) batch.targets = {0, 2, 1}, batch.counted = rows;  // pooled: one label per row
    backend->copy_to_backend(model.loss().answers(), batch.targets.data(), batch.targets.size() * sizeof(std::int32_t));
  }
  // The mean loss over the counted positions; with_gradient: its gradient over the output, then backward.
  double loss(bool with_gradient) {
    model.forward(context);
    LossSums sums;
    float scale = static_cast<float>(1.0 / batch.counted);
    model.apply_loss(rows, with_gradient ? &scale : nullptr, &sums);
    if (with_gradient) model.backward(context, false, nullptr);
    return sums.loss_sum / batch.counted;
  }
  [[nodiscard]] const double* parameter(std::size_t entry) const {
    return static_cast<const double*>(model.master()) + model.parameter_entries()[entry].offset;
  }
};

TEST(SequenceModel, ForwardAndLossMatchReference) {
  SequenceModel test(
      {layer(LayerType::embedding, width), layer(LayerType::layernorm), layer(LayerType::linear, vocabulary)});
  ASSERT_EQ(test.model.positions(), positions);
  ASSERT_EQ(test.model.classes(), vocabulary);
  // random layernorm and linear parameters (initialisation gives gamma 1, beta 0)
  std::mt19937 generator(9);
  std::normal_distribution<double> normal;
  auto* master = static_cast<double*>(test.model.master());
  for (std::size_t entry = 1; entry < test.model.parameter_entries().size(); ++entry)
    for (std::int64_t i = 0; i < test.model.parameter_entries()[entry].count; ++i)
      master[test.model.parameter_entries()[entry].offset + i] = normal(generator);
  const TensorView output = test.model.output(rows);
  std::fill_n(static_cast<double*>(output.data), rows * positions * vocabulary, NAN);  // poisoned
  const double loss = test.loss(false);

  const double *table = test.parameter(0), *position = test.parameter(1), *gamma = test.parameter(2),
               *beta = test.parameter(3), *weight = test.parameter(4), *bias = test.parameter(5);
  double reference_loss = 0.0, worst = 0.0, norm = 0.0;
  for (std::int64_t r = 0; r < rows * positions; ++r) {
    std::vector<double> x(width);
    for (std::int64_t c = 0; c < width; ++c)
      x[c] = table[test.batch.ids[r] * width + c] + position[r % positions * width + c];
    double mean = 0.0, variance = 0.0;
    for (std::int64_t c = 0; c < width; ++c) mean += x[c] / width;
    for (std::int64_t c = 0; c < width; ++c) variance += (x[c] - mean) * (x[c] - mean) / width;
    std::vector<double> normed(width), logits(vocabulary);
    for (std::int64_t c = 0; c < width; ++c)
      normed[c] = (x[c] - mean) / std::sqrt(variance + 1e-5) * gamma[c] + beta[c];
    double largest = -INFINITY;
    for (std::int64_t v = 0; v < vocabulary; ++v) {
      logits[v] = bias[v];
      for (std::int64_t c = 0; c < width; ++c) logits[v] += weight[v * width + c] * normed[c];
      const double got = static_cast<const double*>(output.data)[r * vocabulary + v];
      ASSERT_FALSE(std::isnan(got)) << "row " << r;
      worst = std::max(worst, std::abs(got - logits[v]));
      norm = std::max(norm, std::abs(logits[v]));
      largest = std::max(largest, logits[v]);
    }
    if (test.batch.targets[r] == Loss::ignore_index) continue;
    double sum = 0.0;
    for (double logit : logits) sum += std::exp(logit - largest);
    reference_loss += std::log(sum) + largest - logits[test.batch.targets[r]];
  }
  EXPECT_LT(worst / norm, 1e-12);
  EXPECT_NEAR(loss, reference_loss / test.batch.counted, 1e-12 * std::abs(loss));
}

// The worst relative error of the model's parameter gradients against central differences of its loss.
double worst_gradient_error(SequenceModel& test) {
  std::fill_n(static_cast<double*>(test.model.gradients()), test.model.parameter_count(), NAN);  // poisoned
  test.loss(true);
  const auto* analytic = static_cast<const double*>(test.model.gradients());
  std::vector<double> expected(analytic, analytic + test.model.parameter_count());
  auto* parameters = static_cast<double*>(test.model.master());
  const double step = 1e-6;
  double worst = 0.0;
  for (std::int64_t i = 0; i < test.model.parameter_count(); ++i) {
    const double saved = parameters[i];
    parameters[i] = saved + step;
    const double plus = test.loss(false);
    parameters[i] = saved - step;
    const double minus = test.loss(false);
    parameters[i] = saved;
    const double numeric = (plus - minus) / (2 * step);
    const double got = expected[static_cast<std::size_t>(i)];
    if (std::isnan(got)) {
      ADD_FAILURE() << "parameter " << i << " has no gradient (NaN)";
      return INFINITY;
    }
    const double error = std::abs(numeric - got) / std::max(1e-3, std::abs(numeric));
    worst = std::max(worst, error);
    EXPECT_LT(error, 1e-5) << "parameter " << i << " analytic " << got << " numeric " << numeric;
  }
  testing::Test::RecordProperty("worst_relative_error", std::to_string(worst));
  return worst;
}

TEST(SequenceModel, GradientsMatchCentralDifferences) {
  SequenceModel test({layer(LayerType::embedding, width), layer(LayerType::layernorm), layer(LayerType::linear, 6),
                      layer(LayerType::gelu), layer(LayerType::dropout), layer(LayerType::linear, vocabulary)});
  EXPECT_LT(worst_gradient_error(test), 1e-5);
}

// embedding (with positions) -> attention (2 heads) -> linear, T = 37 (not a multiple of the kernel's tiles): the
// attention's input gradient is what the embedding's tables receive.
TEST(SequenceModel, AttentionGradientsMatchCentralDifferences) {
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    SequenceModel test({layer(LayerType::embedding, 2 * width), layer(LayerType::attention, 0, causal),
                        layer(LayerType::linear, vocabulary)},
                       37);
    ASSERT_EQ(test.model.parameter_entries()[2].name, "c_attn.weight");
    EXPECT_LT(worst_gradient_error(test), 1e-5);
  }
}

// A pre-LayerNorm MLP block as in GPT-2: x + linear(gelu_tanh(linear(layernorm(x)))), on the last axis.
TEST(SequenceModel, ResidualBlockGradientsMatchCentralDifferences) {
  LayerSpec block = layer(LayerType::residual);
  LayerSpec gelu = layer(LayerType::gelu);
  gelu.approximate = GeluApproximation::tanh;
  block.layers = {layer(LayerType::layernorm), layer(LayerType::linear, 6), gelu, layer(LayerType::linear, width)};
  SequenceModel test({layer(LayerType::embedding, width), block, layer(LayerType::linear, vocabulary)});
  ASSERT_EQ(test.model.positions(), positions);
  EXPECT_LT(worst_gradient_error(test), 1e-5);
}

// transformer_block (GPT-2's block: x + attn(ln_1(x)), then + c_proj(gelu(c_fc(ln_2(x))))) expanded by the model into
// two residual blocks, named as GPT-2 names them, on T = 7.
TEST(SequenceModel, TransformerBlockGradientsMatchCentralDifferences) {
  LayerSpec block = layer(LayerType::transformer_block);
  block.name = "h0";
  block.mlp_ratio = 2;
  SequenceModel test(
      {layer(LayerType::embedding, width), block, layer(LayerType::layernorm), layer(LayerType::linear, vocabulary)},
      7);
  std::vector<std::string> names;
  for (std::size_t i = 0; i < test.model.layer_count(); ++i)
    names.push_back(test.model.layer(i).name() + ":" + test.model.layer(i).type());
  EXPECT_EQ(names,
            (std::vector<std::string>{"embedding4:embedding", "h0:residual", "h0.ln_1:layernorm", "h0.attn:attention",
                                      "h0:add", "h0:residual", "h0.ln_2:layernorm", "h0.c_fc:linear", "h0.gelu:gelu",
                                      "h0.c_proj:linear", "h0:add", "layernorm0:layernorm", "linear7:linear"}));
  EXPECT_EQ(test.model.layer(7).output_width(), 7 * 2 * width);  // c_fc: mlp_ratio x C per position
  EXPECT_LT(worst_gradient_error(test), 1e-5);
}

LayerSpec tied_head(bool bias) {
  LayerSpec head = layer(LayerType::linear, vocabulary);
  head.tie = "embedding" + std::to_string(width);
  head.bias = bias;
  return head;
}

// GPT-2's LM head: the linear layer's weight is the embedding's table, one tensor that both gradients go into.
TEST(SequenceModel, TiedHeadIsOneParameterWithBothGradients) {
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with bias" : "without bias");
    SequenceModel test({layer(LayerType::embedding, width), layer(LayerType::layernorm), tied_head(bias)});
    const auto& entries = test.model.parameter_entries();
    ASSERT_EQ(entries.size(), bias ? 5u : 4u);  // table, position, gamma, beta (, the head's bias)
    EXPECT_EQ(entries.front().layer, "embedding4");
    EXPECT_EQ(entries.front().name, "weight");
    EXPECT_EQ(test.model.trainable_parameters(),
              vocabulary * width + positions * width + 2 * width + (bias ? vocabulary : 0));
    EXPECT_NE(test.model.summary().find("uses the table of 'embedding4' as its weight"), std::string::npos);
    EXPECT_LT(worst_gradient_error(test), 1e-5);
  }
}

// Micro-batches: the head adds into the shared slot too (a second backward doubles the gradient), and each slot is
// final when after_layer says so (the table, written by the head and the embedding, only at the end: begin 0).
TEST(SequenceModel, TiedGradientAccumulatesAndIsFinalLast) {
  SequenceModel test({layer(LayerType::embedding, width), layer(LayerType::layernorm), tied_head(true)});
  test.loss(true);
  const auto* gradients = static_cast<const double*>(test.model.gradients());
  const std::vector<double> once(gradients, gradients + test.model.parameter_count());
  std::vector<std::pair<std::int64_t, std::vector<double>>> reported;
  test.model.backward(test.context, true, [&](std::int64_t begin) {
    reported.emplace_back(begin, std::vector<double>(gradients + begin, gradients + test.model.parameter_count()));
  });
  ASSERT_FALSE(reported.empty());
  EXPECT_EQ(reported.back().first, 0);
  for (const auto& [begin, values] : reported)
    for (std::size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(values[i], gradients[begin + static_cast<std::int64_t>(i)])
          << "changed after after_layer(" << begin << "): element " << begin + i;
  double worst = 0.0, norm = 0.0;
  for (std::int64_t i = 0; i < test.model.parameter_count(); ++i) {
    worst = std::max(worst, std::abs(gradients[i] - 2 * once[static_cast<std::size_t>(i)]));
    norm = std::max(norm, std::abs(once[static_cast<std::size_t>(i)]));
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(worst / norm, 1e-13);
}

// An encoder's classifier: the sequence pooled (mean or first position) into one vector per sample.
TEST(SequenceModel, SequencePoolGradientsMatchCentralDifferences) {
  for (const SequencePoolMode mode : {SequencePoolMode::mean, SequencePoolMode::first}) {
    SCOPED_TRACE(word_of(mode));
    LayerSpec pool = layer(LayerType::sequence_pool);
    pool.mode = mode;
    SequenceModel test({layer(LayerType::embedding, width), layer(LayerType::linear, 6), layer(LayerType::gelu), pool,
                        layer(LayerType::linear, 3)});
    ASSERT_EQ(test.model.positions(), 1);
    ASSERT_EQ(test.model.layer(3).output_shape(), SampleShape{6});
    EXPECT_LT(worst_gradient_error(test), 1e-5);
  }
}

// The shapes the deck cannot check: the head's input must be as wide as the table's rows.
TEST(SequenceModel, TiedHeadOfTheWrongWidthIsRefused) {
  try {
    SequenceModel test({layer(LayerType::embedding, width), layer(LayerType::linear, 3), tied_head(true)});
    FAIL() << "a tied head reading 3 features from a table of width 4 was accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("input features arrive and the table rows have 4"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace hpctrain
