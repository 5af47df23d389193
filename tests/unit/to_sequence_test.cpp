// to_sequence (issue 16, vision transformers): a conv feature map (C, H, W) or (C, D, H, W) as a sequence (S (+1), C).
// The CPU kernels against the index formula (position s = h * W + w of the channels-first map, the class token first,
// the position row added before the one rounding) in every dtype and both layouts; the layer's input and parameter
// gradients against f64 central differences (class token on and off, positions on and off, both layouts, 2-D and
// 3-D maps); and a small vision transformer (patch conv2d -> to_sequence -> non-causal transformer_block -> layernorm
// -> sequence_pool -> linear) as a Model: per-sample classes (not per-position), the conv stack channels-last on a
// backend that prefers it with the same outputs as channels-first, and the errors of misplaced layers.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/layer.hpp"
#include "hpctrain/nn/model.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;  // NOLINT(google-build-using-namespace): test harness

constexpr SpatialLayout layouts[] = {SpatialLayout::channels_first, SpatialLayout::channels_last};

std::string describe(SpatialLayout layout, bool class_token, bool positions) {
  return std::string(layout == SpatialLayout::channels_last ? "channels-last" : "channels-first") +
         (class_token ? ", class token" : "") + (positions ? ", positions" : "");
}

// Index of channel c, spatial element s of a (channels, spatial) map in `layout` order.
std::size_t map_index(SpatialLayout layout, std::int64_t channels, std::int64_t spatial, std::int64_t c,
                      std::int64_t s) {
  return static_cast<std::size_t>(layout == SpatialLayout::channels_last ? s * channels + c : c * spatial + s);
}

// Rows of channels-first maps rewritten in `layout` order.
std::vector<double> in_layout(const std::vector<double>& first, std::int64_t rows, std::int64_t channels,
                              SpatialLayout layout) {
  const std::int64_t spatial = static_cast<std::int64_t>(first.size()) / rows / channels;
  std::vector<double> result(first.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < channels; ++c)
      for (std::int64_t s = 0; s < spatial; ++s)
        result[static_cast<std::size_t>(r * channels * spatial) + map_index(layout, channels, spatial, c, s)] =
            first[static_cast<std::size_t>((r * channels + c) * spatial + s)];
  return result;
}

TEST(ToSequenceKernels, MatchTheIndexFormula) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 3, channels = 6, spatial = 35;  // a 5 x 7 map
  for (DType dtype : all_dtypes)
    for (SpatialLayout layout : layouts)
      for (bool class_token : {false, true})
        for (bool positions : {false, true}) {
          const std::string where = std::string(dtype_name(dtype)) + ", " + describe(layout, class_token, positions);
          const std::int64_t first = class_token ? 1 : 0, sequence = spatial + first;
          const DType master = master_of(dtype);
          TestTensor x(*backend, dtype, rows, channels * spatial), y(*backend, dtype, rows, sequence * channels);
          const auto x_first = quantized(dtype, random_values(x.size(), 7));  // channels-first values
          x.set(in_layout(x_first, rows, channels, layout));
          TestTensor token(*backend, master, 1, channels), table(*backend, master, sequence, channels);
          const auto token_values = token.randomize(11), table_values = table.randomize(13);
          y.poison();
          backend->to_sequence_forward(channels, layout, x.view(), class_token ? token.data() : nullptr,
                                       positions ? table.data() : nullptr, y.view());
          std::vector<double> want(y.size());
          for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t t = 0; t < sequence; ++t)
              for (std::int64_t c = 0; c < channels; ++c) {
                const std::int64_t s = t - first;
                double value = s < 0 ? token_values[static_cast<std::size_t>(c)]
                                     : x_first[static_cast<std::size_t>((r * channels + c) * spatial + s)];
                if (positions) value += table_values[static_cast<std::size_t>(t * channels + c)];
                want[static_cast<std::size_t>((r * sequence + t) * channels + c)] = value;
              }
          EXPECT_LE(relative_error(y.get(), quantized(dtype, want)), tolerance(dtype)) << "forward, " << where;

          // Backward: the input gradient is a copy back into the layout; the parameter gradients column sums.
          TestTensor dy(*backend, dtype, rows, sequence * channels), dx(*backend, dtype, rows, channels * spatial);
          const auto dy_values = dy.randomize(17);
          for (bool accumulate : {false, true}) {
            TestTensor dtoken(*backend, master, 1, channels), dtable(*backend, master, sequence, channels);
            const auto token_before = dtoken.randomize(19), table_before = dtable.randomize(23);
            if (!accumulate) dtoken.poison(), dtable.poison();
            dx.poison();
            backend->to_sequence_backward(channels, layout, dy.view(), dx.view(), class_token ? dtoken.data() : nullptr,
                                          positions ? dtable.data() : nullptr, accumulate);
            std::vector<double> dx_first(dx.size()), sums(static_cast<std::size_t>(sequence * channels));
            for (std::int64_t r = 0; r < rows; ++r)
              for (std::int64_t t = 0; t < sequence; ++t)
                for (std::int64_t c = 0; c < channels; ++c) {
                  const double g = dy_values[static_cast<std::size_t>((r * sequence + t) * channels + c)];
                  sums[static_cast<std::size_t>(t * channels + c)] += g;
                  if (t >= first) dx_first[static_cast<std::size_t>((r * channels + c) * spatial + t - first)] = g;
                }
            EXPECT_EQ(dx.get(), in_layout(dx_first, rows, channels, layout)) << "dx, " << where;
            const double sum_tolerance = master == DType::f64 ? 1e-13 : 1e-6;
            if (class_token) {
              std::vector<double> want_token(sums.begin(), sums.begin() + channels);
              if (accumulate)
                for (std::int64_t c = 0; c < channels; ++c) want_token[c] += token_before[c];
              EXPECT_LE(relative_error(dtoken.get(), want_token), sum_tolerance) << "dclass_token, " << where;
            }
            if (positions) {
              std::vector<double> want_table = sums;
              if (accumulate)
                for (std::size_t i = 0; i < want_table.size(); ++i) want_table[i] += table_before[i];
              EXPECT_LE(relative_error(dtable.get(), want_table), sum_tolerance) << "dposition, " << where;
            }
          }
          // The first layer of a model: no input gradient.
          backend->to_sequence_backward(channels, layout, dy.view(), {nullptr, dtype, rows, channels * spatial},
                                        nullptr, nullptr, false);
        }
}

LayerSpec to_sequence_spec(bool class_token, bool positions) {
  LayerSpec spec;
  spec.type = LayerType::to_sequence;
  spec.name = "patches";
  spec.class_token = class_token;
  spec.positions = positions;
  return spec;
}

// The layer in f64: loss = sum(w * y) + sum(y^2) / 2, so dy = w + y; input and parameter gradients from backward
// against central differences of the loss.
void check_layer_gradients(const SampleShape& shape, SpatialLayout layout, bool class_token, bool positions) {
  SCOPED_TRACE(batch_shape_text(shape) + ", " + describe(layout, class_token, positions));
  auto backend = make_cpu_backend();
  auto layer = make_layer(to_sequence_spec(class_token, positions), shape, "test.toml:1:1", layout);
  const std::int64_t channels = shape[0], spatial = shape_size(shape) / channels, rows = 2;
  ASSERT_EQ(layer->output_shape(), (SampleShape{spatial + (class_token ? 1 : 0), channels}));
  std::int64_t parameter_count = 0;
  std::vector<std::int64_t> offsets;
  for (const ParameterSpec& parameter : layer->parameters()) {
    offsets.push_back(parameter_count);
    parameter_count += shape_size(parameter.shape);
  }
  ASSERT_EQ(parameter_count, (class_token ? channels : 0) + (positions ? layer->output_width() : 0));
  std::vector<double> parameters = random_values(static_cast<std::size_t>(parameter_count), 29);
  std::vector<double> gradients(parameters.size(), NAN);
  layer->bind({parameters.data(), gradients.data(), parameters.data(), DType::f64, DType::f64, offsets, {}});

  std::vector<double> x = random_values(static_cast<std::size_t>(rows * layer->input_width()), 31);
  const std::vector<double> w = random_values(static_cast<std::size_t>(rows * layer->output_width()), 37);
  std::vector<double> y(w.size()), dy(w.size()), dx(x.size(), NAN);
  StepContext context{backend.get(), true, 1, 0, nullptr, rows};
  const auto loss = [&]() {
    std::fill(y.begin(), y.end(), NAN);
    layer->forward(context, 0, {x.data(), DType::f64, rows, layer->input_width()},
                   {y.data(), DType::f64, rows, layer->output_width()});
    double sum = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) sum += w[i] * y[i] + 0.5 * y[i] * y[i];
    return sum;
  };
  loss();
  for (std::size_t i = 0; i < y.size(); ++i) dy[i] = w[i] + y[i];
  layer->backward(context, 0, {x.data(), DType::f64, rows, layer->input_width()},
                  {y.data(), DType::f64, rows, layer->output_width()},
                  {dy.data(), DType::f64, rows, layer->output_width()},
                  {dx.data(), DType::f64, rows, layer->input_width()}, false);
  const std::vector<double> analytic_parameters = gradients;
  EXPECT_LE(relative_error(dx, central_differences(x, 1e-6, loss)), 1e-8) << "input gradient";
  if (parameter_count > 0)
    EXPECT_LE(relative_error(analytic_parameters, central_differences(parameters, 1e-6, loss)), 1e-8)
        << "parameter gradients";
}

TEST(ToSequenceLayer, GradientsMatchCentralDifferences) {
  for (const SampleShape& shape : {SampleShape{4, 3, 5}, SampleShape{3, 2, 2, 3}})
    for (SpatialLayout layout : layouts)
      for (bool class_token : {false, true})
        for (bool positions : {false, true}) check_layer_gradients(shape, layout, class_token, positions);
}

TEST(ToSequenceLayer, RefusesWhatIsNotAFeatureMap) {
  for (const SampleShape& shape : {SampleShape{48}, SampleShape{5, 8}}) {
    try {
      (void)make_layer(to_sequence_spec(true, true), shape, "deck.toml:9:1", SpatialLayout::channels_first,
                       shape.size() == 2);
      ADD_FAILURE() << "no error for " << batch_shape_text(shape);
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what())
                    .find("deck.toml:9:1: layer 'patches' (to_sequence) receives samples of shape " +
                          batch_shape_text(shape)),
                std::string::npos)
          << error.what();
    }
  }
}

double standard_deviation(const float* values, std::int64_t count) {
  double sum = 0.0, squares = 0.0;
  for (std::int64_t i = 0; i < count; ++i) sum += values[i], squares += double(values[i]) * values[i];
  const double mean = sum / static_cast<double>(count);
  return std::sqrt(squares / static_cast<double>(count) - mean * mean);
}

// pytorch (the default): timm's ViT, position table normal(0, 0.02) and class token normal(0, 1e-6); gpt2: both
// normal(0, 0.02), as the embedding's tables.
TEST(ToSequenceLayer, InitialisationPerScheme) {
  auto layer = make_layer(to_sequence_spec(true, true), SampleShape{64, 8, 8}, "test.toml:1:1");
  const std::int64_t channels = 64, table = 65 * 64;
  for (InitScheme scheme : {InitScheme::pytorch, InitScheme::gpt2}) {
    SCOPED_TRACE(std::string(word_of(scheme)));
    std::vector<float> values(static_cast<std::size_t>(channels + table), NAN);
    layer->initialize(values.data(), 5, 1, Initialization{scheme});
    const double token_std = scheme == InitScheme::pytorch ? 1e-6 : 0.02;
    EXPECT_NEAR(standard_deviation(values.data(), channels), token_std, 0.3 * token_std) << "class token";
    EXPECT_NEAR(standard_deviation(values.data() + channels, table), 0.02, 0.002) << "position table";
    std::vector<float> again(values.size());
    layer->initialize(again.data(), 5, 1, Initialization{scheme});
    EXPECT_EQ(again, values);  // the seed alone decides
  }
}

// ---- a small vision transformer as a Model ----

LayerSpec layer(LayerType type, std::int64_t out = 0) {
  LayerSpec spec;
  spec.type = type;
  spec.name = std::string(word_of(type)) + std::to_string(out);
  spec.out = out;
  spec.heads = 2;
  spec.causal = false;
  return spec;
}

// (3, 8, 8) images -> 2 x 2 patches of 4 x 4 as 8 channels -> (1 + 4, 8) -> encoder -> 3 classes.
std::vector<LayerSpec> vision_transformer(SequencePoolMode pool = SequencePoolMode::first) {
  LayerSpec patches = layer(LayerType::conv2d, 8);
  patches.kernel = {4};
  patches.stride = {4};
  LayerSpec pooling = layer(LayerType::sequence_pool);
  pooling.mode = pool;
  return {patches, to_sequence_spec(true, true), layer(LayerType::transformer_block), layer(LayerType::layernorm),
          pooling, layer(LayerType::linear, 3)};
}

constexpr std::int64_t model_rows = 4;
const SampleShape image_shape{3, 8, 8};

std::vector<double> model_output(Backend& backend, std::vector<LayerSpec> layers, std::string* summary = nullptr) {
  Model model(ModelSection{std::move(layers)}, image_shape, backend, {DType::f64, DType::f64, model_rows}, "test.toml");
  model.initialize(7);
  EXPECT_EQ(model.positions(), 1);  // one label per sample, as a CNN's
  EXPECT_EQ(model.classes(), 3);
  EXPECT_EQ(model.output_width(), 3);
  if (summary != nullptr) *summary = model.summary();
  const auto input = random_values(static_cast<std::size_t>(model_rows * shape_size(image_shape)), 41);
  backend.copy_to_backend(model.input(model_rows).data, input.data(), input.size() * sizeof(double));
  std::vector<std::int64_t> sample_ids{0, 1, 2, 3};
  const TensorView output = model.forward({&backend, false, 1, 0, sample_ids.data(), model_rows});
  std::vector<double> values(static_cast<std::size_t>(model_rows * 3));
  backend.copy_to_host(values.data(), output.data, values.size() * sizeof(double));
  return values;
}

TEST(VisionTransformer, SameOutputsInBothLayoutsAndPerSampleClasses) {
  for (SequencePoolMode pool : {SequencePoolMode::first, SequencePoolMode::mean}) {
    auto last = make_cpu_backend(SpatialLayout::channels_last), first = make_cpu_backend(SpatialLayout::channels_first);
    std::string summary_last, summary_first;
    const auto out_last = model_output(*last, vision_transformer(pool), &summary_last);
    const auto out_first = model_output(*first, vision_transformer(pool), &summary_first);
    ASSERT_FALSE(has_nan(out_last));
    EXPECT_NE(summary_last.find("conv layers run channels-last"), std::string::npos) << summary_last;
    EXPECT_NE(summary_last.find("to_sequence reads them as they are"), std::string::npos) << summary_last;
    EXPECT_EQ(summary_first.find("channels-last"), std::string::npos) << summary_first;
    EXPECT_NE(summary_first.find("(N, 5, 8)"), std::string::npos) << summary_first;  // to_sequence's output
    EXPECT_LE(relative_error(out_last, out_first), 1e-12);
  }
}

TEST(VisionTransformer, SequenceLayersNeedToSequence) {
  auto backend = make_cpu_backend();
  auto layers = vision_transformer();
  layers.erase(layers.begin() + 1);  // the transformer_block right after the conv layer
  try {
    (void)model_output(*backend, layers);
    ADD_FAILURE() << "no error without to_sequence";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("(transformer_block) receives samples (N, 8, 2, 2), not a sequence"),
              std::string::npos)
        << error.what();
    EXPECT_NE(error.hint().find("an embedding or a to_sequence"), std::string::npos) << error.hint();
  }
}

}  // namespace
}  // namespace hpctrain
