// The attention layer (src/nn/attention_layer.cpp) on the CPU backend, bound by hand as the Model binds it: its
// forward against a naive f64 reference (qkv projection, an explicit softmax over the T x T scores of each head, output
// projection) in f64, f32 and bf16; in f64 the gradients of every parameter and of the input against central
// differences, causal and not, on T = 37 positions (not a multiple of the kernel's tiles), without and with dropout on
// the probabilities (the mask fixed by the step's keys); dropout only in training (evaluation is the plain layer's
// output, bit for bit); accumulation; deck errors.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/nn/layer.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;

constexpr std::int64_t rows = 2, sequence = 37, width = 8, heads = 2;

// The global sample indices of the two rows (host memory, the CPU backend's).
const std::int64_t sample_ids[rows] = {12, 4};

LayerSpec attention_spec(bool causal, double dropout = 0.0) {
  LayerSpec spec;
  spec.type = LayerType::attention;
  spec.name = "attn";
  spec.heads = heads;
  spec.causal = causal;
  spec.dropout = dropout;
  return spec;
}

// The layer with its parameters, saved storage and workspace, in storage dtype `dtype` (master: f64 for f64, else
// f32; a 16-bit working copy of the weights for bf16).
struct BoundAttention {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  DType dtype, master;
  std::unique_ptr<Layer> layer;
  std::int64_t parameter_count = 0;
  TestTensor parameters, gradients, working, lse, saved, workspace, x, y, dy, dx;
  StepContext context{backend.get(), true, 1, 5, sample_ids, rows};

  BoundAttention(DType storage, bool causal, double dropout = 0.0)
      : dtype(storage),
        master(master_of(storage)),
        layer(make_layer(attention_spec(causal, dropout), {sequence, width}, "test.toml:1:1",
                         SpatialLayout::channels_first, true)),
        parameter_count(4 * width * width + 4 * width),
        parameters(*backend, master, 1, parameter_count),
        gradients(*backend, master, 1, parameter_count),
        working(*backend, storage, 1, parameter_count),
        lse(*backend, master, 1, layer->saved_per_row() * rows),
        saved(*backend, storage, 1, layer->saved_activations_per_row() * rows),
        workspace(*backend, storage, 1, layer->backward_workspace_per_row() * rows),
        x(*backend, storage, rows, sequence * width),
        y(*backend, storage, rows, sequence * width),
        dy(*backend, storage, rows, sequence * width),
        dx(*backend, storage, rows, sequence * width) {
    ParameterBinding binding{parameters.data(), gradients.data(), working.data(), master, storage, {}};
    std::int64_t offset = 0;
    for (const ParameterSpec& spec : layer->parameters()) {
      binding.offsets.push_back(offset);
      offset += shape_size(spec.shape);
    }
    EXPECT_EQ(offset, parameter_count);
    layer->bind(std::move(binding));
    layer->bind_saved(lse.data(), rows);
    layer->bind_activation_storage(saved.data(), workspace.data(), rows);
  }
  // Parameters (master) and their working copy, as the model keeps them.
  void set_parameters(const std::vector<double>& values) {
    parameters.set(values);
    backend->cast(parameters.view(), working.view());
  }
  std::vector<double> forward() {
    y.poison();
    layer->forward(context, 1, x.view(), y.view());
    return y.get();
  }
  void backward(bool accumulate) { layer->backward(context, 1, x.view(), y.view(), dy.view(), dx.view(), accumulate); }
};

// y for input x (rows, T, C) and parameters [W_attn (3C, C), b_attn (3C), W_proj (C, C), b_proj (C)], in f64 with an
// explicit softmax per (row, head, query).
std::vector<double> reference_forward(const std::vector<double>& x, const std::vector<double>& p, bool causal) {
  const double *w_attn = p.data(), *b_attn = w_attn + 3 * width * width, *w_proj = b_attn + 3 * width,
               *b_proj = w_proj + width * width;
  const std::int64_t head_dim = width / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<double> qkv(sequence * 3 * width), heads_out(sequence * width);
    for (std::int64_t t = 0; t < sequence; ++t)
      for (std::int64_t o = 0; o < 3 * width; ++o) {
        double sum = b_attn[o];
        for (std::int64_t c = 0; c < width; ++c) sum += x[(r * sequence + t) * width + c] * w_attn[o * width + c];
        qkv[t * 3 * width + o] = sum;
      }
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < sequence; ++t) {
        std::vector<double> scores(sequence, -INFINITY);  // one row of the T x T matrix
        double largest = -INFINITY;
        for (std::int64_t s = 0; s < (causal ? t + 1 : sequence); ++s) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < head_dim; ++d)
            dot += qkv[t * 3 * width + h * head_dim + d] * qkv[s * 3 * width + width + h * head_dim + d];
          scores[s] = scale * dot;
          largest = std::max(largest, scores[s]);
        }
        double total = 0.0;
        for (double& score : scores) total += score = std::exp(score - largest);
        for (std::int64_t d = 0; d < head_dim; ++d) {
          double sum = 0.0;
          for (std::int64_t s = 0; s < sequence; ++s)
            sum += scores[s] / total * qkv[s * 3 * width + 2 * width + h * head_dim + d];
          heads_out[t * width + h * head_dim + d] = sum;
        }
      }
    for (std::int64_t t = 0; t < sequence; ++t)
      for (std::int64_t o = 0; o < width; ++o) {
        double sum = b_proj[o];
        for (std::int64_t c = 0; c < width; ++c) sum += heads_out[t * width + c] * w_proj[o * width + c];
        y[(r * sequence + t) * width + o] = sum;
      }
  }
  return y;
}

TEST(AttentionLayer, ForwardMatchesTheNaiveReference) {
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (const bool causal : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (causal ? " causal" : " not causal"));
      BoundAttention test(dtype, causal);
      const std::vector<double> parameters = quantized(test.master, random_values(test.parameter_count, 3, -0.5, 0.5));
      test.set_parameters(parameters);
      const std::vector<double> x = test.x.randomize(4, -2.0, 2.0);
      // The reference reads the weights as the products do (the working copy) and the biases from the master.
      std::vector<double> read = parameters;
      const std::vector<double> working = test.working.get();
      for (std::int64_t i = 0; i < 3 * width * width; ++i) read[i] = working[i];
      for (std::int64_t i = 3 * width * (width + 1); i < 3 * width * (width + 1) + width * width; ++i)
        read[i] = working[i];
      const double error = relative_error(test.forward(), reference_forward(x, read, causal));
      // f32/bf16: qkv and the heads' output are rounded to the storage dtype on the way
      EXPECT_LE(error, dtype == DType::f64 ? 1e-12 : dtype == DType::f32 ? 2e-5 : 3e-2);
    }
  }
}

TEST(AttentionLayer, GradientsOfParametersAndInputMatchCentralDifferences) {
  // With dropout (the mask fixed by the context's step): causal only, the kernel's own test covers the other.
  for (const auto& [dropout, causal] : {std::pair{0.0, true}, std::pair{0.0, false}, std::pair{0.3, true}}) {
    SCOPED_TRACE(std::string(causal ? "causal" : "not causal") + ", dropout " + std::to_string(dropout));
    BoundAttention test(DType::f64, causal, dropout);
    std::vector<double> parameters = random_values(test.parameter_count, 5, -0.5, 0.5);
    std::vector<double> x = random_values(rows * sequence * width, 6, -2.0, 2.0);
    const std::vector<double> weights = random_values(rows * sequence * width, 7);  // loss = sum(weights * y)
    test.set_parameters(parameters);
    test.x.set(x);
    test.dy.set(weights);
    test.forward();
    test.gradients.poison();
    test.dx.poison();
    test.backward(false);
    const std::vector<double> parameter_gradients = test.gradients.get(), input_gradient = test.dx.get();
    ASSERT_FALSE(has_nan(parameter_gradients));
    ASSERT_FALSE(has_nan(input_gradient));

    const auto loss = [&] {
      test.set_parameters(parameters);
      test.x.set(x);
      const std::vector<double> y = test.forward();
      double sum = 0.0;
      for (std::size_t i = 0; i < y.size(); ++i) sum += weights[i] * y[i];
      return sum;
    };
    EXPECT_LE(relative_error(parameter_gradients, central_differences(parameters, 1e-6, loss)), 1e-8);
    EXPECT_LE(relative_error(input_gradient, central_differences(x, 1e-6, loss)), 1e-8);

    // accumulate: a second backward adds the same gradients
    test.set_parameters(parameters);
    test.x.set(x);
    test.forward();
    test.backward(true);
    std::vector<double> doubled = parameter_gradients;
    for (double& value : doubled) value *= 2.0;
    EXPECT_LE(relative_error(test.gradients.get(), doubled), 1e-14);
  }
}

// Dropout acts in training only: evaluation gives the output of the layer without dropout, bit for bit, and training
// another one (the mask matters) that changes with the step; the same step repeats its mask.
TEST(AttentionLayer, DropoutActsInTrainingOnly) {
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    BoundAttention plain(dtype, true), dropped(dtype, true, 0.4);
    const std::vector<double> parameters = random_values(plain.parameter_count, 3, -0.5, 0.5);
    const std::vector<double> x = random_values(rows * sequence * width, 4, -2.0, 2.0);
    for (BoundAttention* test : {&plain, &dropped}) {
      test->set_parameters(parameters);
      test->x.set(x);
    }
    plain.context.training = dropped.context.training = false;
    const std::vector<double> evaluation = plain.forward();
    ASSERT_FALSE(has_nan(evaluation));
    EXPECT_EQ(dropped.forward(), evaluation);
    dropped.context.training = true;
    const std::vector<double> training = dropped.forward();
    EXPECT_GT(relative_error(training, evaluation), 0.05);
    EXPECT_EQ(dropped.forward(), training);
    dropped.context.step += 1;
    EXPECT_NE(dropped.forward(), training);
  }
}

TEST(AttentionLayer, InitialisationIsPyTorchsLinearDefault) {
  BoundAttention test(DType::f32, true);
  std::vector<float> host(static_cast<std::size_t>(test.parameter_count), NAN);
  test.layer->initialize(host.data(), 11, 2, Initialization{});
  const double bound = 1.0 / std::sqrt(static_cast<double>(width));
  double largest = 0.0;
  for (float value : host) {
    ASSERT_TRUE(std::isfinite(value));
    largest = std::max(largest, std::abs(static_cast<double>(value)));
  }
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.9 * bound);
  // the two projections draw from their own streams: c_proj's weight does not repeat c_attn's first values
  EXPECT_NE(host[0], host[static_cast<std::size_t>(3 * width * (width + 1))]);
}

// model.init = "gpt2": both weights normal(0, std), c_proj's at the projection std once the layer ends a residual
// branch (the Model marks it), the biases zero.
TEST(AttentionLayer, Gpt2InitialisationScalesTheOutputProjection) {
  BoundAttention test(DType::f32, true);
  const Initialization init{InitScheme::gpt2, 0.02, 0.002};
  const auto rms = [](const float* values, std::int64_t count) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < count; ++i) sum += static_cast<double>(values[i]) * values[i];
    return std::sqrt(sum / static_cast<double>(count));
  };
  // the mean square over 20 seeds (1,280 values of c_proj, 3,840 of c_attn): a relative error of about 4% (1 sigma)
  for (const bool projection : {false, true}) {
    SCOPED_TRACE(projection ? "ends a residual branch" : "alone");
    test.layer->set_residual_output(projection);
    double attn_square = 0.0, proj_square = 0.0;
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      std::vector<float> host(static_cast<std::size_t>(test.parameter_count), NAN);
      test.layer->initialize(host.data(), seed, 2, init);
      const float* c_attn = host.data();
      const float* c_attn_bias = c_attn + 3 * width * width;
      const float* c_proj = c_attn_bias + 3 * width;
      const float* c_proj_bias = c_proj + width * width;
      attn_square += std::pow(rms(c_attn, 3 * width * width), 2) / 20;
      proj_square += std::pow(rms(c_proj, width * width), 2) / 20;
      for (std::int64_t i = 0; i < 3 * width; ++i) ASSERT_EQ(c_attn_bias[i], 0.0f);
      for (std::int64_t i = 0; i < width; ++i) ASSERT_EQ(c_proj_bias[i], 0.0f);
    }
    EXPECT_NEAR(std::sqrt(attn_square), 0.02, 0.002);
    const double expected = projection ? 0.002 : 0.02;
    EXPECT_NEAR(std::sqrt(proj_square), expected, 0.15 * expected);
  }
}

TEST(AttentionLayer, DeckMistakesAreInputErrors) {
  LayerSpec spec = attention_spec(true);
  spec.heads = 3;  // does not divide 8
  EXPECT_THROW(make_layer(spec, {sequence, width}, "deck.toml:4:1", SpatialLayout::channels_first, true), InputError);
  spec.heads = heads;
  // feature vectors and images are not sequences
  EXPECT_THROW(make_layer(spec, {sequence * width}, "deck.toml:4:1"), InputError);
  EXPECT_THROW(make_layer(spec, {2, sequence, width}, "deck.toml:4:1"), InputError);
  try {
    spec.heads = 3;
    (void)make_layer(spec, {sequence, width}, "deck.toml:4:1", SpatialLayout::channels_first, true);
    ADD_FAILURE() << "heads = 3 on C = 8 was accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("deck.toml:4:1"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace hpctrain
