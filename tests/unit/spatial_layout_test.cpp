// Channels-last activations on the CPU backend: the layout conversion against an explicit index formula; every spatial
// operation on channels-last samples against the same operation on channels-first samples (convolutions and groupnorm
// within the dtype's tolerance, as they sum in another order; pooling bit for bit, as its loops visit the same
// elements in the same order); and the model's choice of layout, with the same outputs and gradients either
// way. Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;
constexpr SpatialLayout first = SpatialLayout::channels_first;
constexpr SpatialLayout last = SpatialLayout::channels_last;

// Row-major (rows, C, S) values rearranged as (rows, S, C) (to_last) or back, written out index by index.
std::vector<double> rearrange(const std::vector<double>& values, std::int64_t rows, std::int64_t channels,
                              bool to_last) {
  std::vector<double> result(values.size());
  const std::int64_t spatial = static_cast<std::int64_t>(values.size()) / rows / channels;
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t c = 0; c < channels; ++c)
      for (std::int64_t s = 0; s < spatial; ++s) {
        const auto first_index = static_cast<std::size_t>((n * channels + c) * spatial + s);
        const auto last_index = static_cast<std::size_t>((n * spatial + s) * channels + c);
        if (to_last)
          result[last_index] = values[first_index];
        else
          result[first_index] = values[last_index];
      }
  return result;
}

std::int64_t weight_cols(const SpatialGeometry& g) { return g.in_channels / g.groups * g.kernel_size(); }

SpatialGeometry with_layout(SpatialGeometry g, SpatialLayout layout) {
  g.layout = layout;
  return g;
}

TEST(SpatialLayout, ConversionMatchesTheIndexFormulaBothWays) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 3, channels = 5, spatial = 130;  // more than one block of positions
  for (DType dtype : all_dtypes) {
    TestTensor x(*backend, dtype, rows, channels * spatial), y(*backend, dtype, rows, channels * spatial);
    TestTensor back(*backend, dtype, rows, channels * spatial);
    const auto values = x.randomize(7);
    y.poison(), back.poison();
    backend->convert_spatial_layout(channels, first, x.view(), y.view());
    EXPECT_EQ(y.get(), rearrange(values, rows, channels, true)) << dtype_name(dtype);
    backend->convert_spatial_layout(channels, last, y.view(), back.view());
    EXPECT_EQ(back.get(), values) << dtype_name(dtype);
  }
}

std::vector<SpatialGeometry> geometries() {
  return {
      make_geometry(2, 3, 16, 1, {6, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 1}),
      make_geometry(2, 4, 6, 2, {9, 8}, {3, 2}, {2, 1}, {1, 0}, {2, 1}),
      make_geometry(2, 4, 4, 4, {5, 5}, {3, 3}, {1, 2}, {1, 1}, {1, 1}),  // depthwise
      make_geometry(3, 2, 8, 1, {5, 6, 4}, {3, 3, 3}, {1, 2, 1}, {1, 1, 1}, {1, 1, 1}),
      make_geometry(3, 16, 16, 1, {4, 4, 4}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}),
  };
}

// The same convolution on channels-first and channels-last rows: forward, both backward passes, in every dtype.
TEST(SpatialLayout, ConvolutionsAgreeAcrossLayouts) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 3;
  for (const SpatialGeometry& g : geometries())
    for (DType dtype : all_dtypes) {
      const std::int64_t in_cols = g.in_channels * g.input_size(), out_cols = g.out_channels * g.output_size();
      const DType gradient_dtype = master_of(dtype);
      const std::string what = describe(g) + " " + dtype_name(dtype);
      TestTensor x(*backend, dtype, rows, in_cols), w(*backend, dtype, g.out_channels, weight_cols(g));
      TestTensor dy(*backend, dtype, rows, out_cols);
      const auto x_values = x.randomize(61), dy_values = dy.randomize(63);
      w.randomize(62);
      TestTensor x_last(*backend, dtype, rows, in_cols), dy_last(*backend, dtype, rows, out_cols);
      x_last.set(rearrange(x_values, rows, g.in_channels, true));
      dy_last.set(rearrange(dy_values, rows, g.out_channels, true));

      TestTensor y(*backend, dtype, rows, out_cols), y_last(*backend, dtype, rows, out_cols);
      TestTensor dx(*backend, dtype, rows, in_cols), dx_last(*backend, dtype, rows, in_cols);
      TestTensor dw(*backend, gradient_dtype, g.out_channels, weight_cols(g));
      TestTensor dw_last(*backend, gradient_dtype, g.out_channels, weight_cols(g));
      y.poison(), y_last.poison(), dx.poison(), dx_last.poison(), dw.poison(), dw_last.poison();
      backend->convolution_forward(with_layout(g, first), x.view(), w.view(), nullptr, y.view());
      backend->convolution_forward(with_layout(g, last), x_last.view(), w.view(), nullptr, y_last.view());
      backend->convolution_backward_data(with_layout(g, first), dy.view(), w.view(), dx.view());
      backend->convolution_backward_data(with_layout(g, last), dy_last.view(), w.view(), dx_last.view());
      backend->convolution_backward_weights(with_layout(g, first), x.view(), dy.view(), dw.view(), nullptr, false);
      backend->convolution_backward_weights(with_layout(g, last), x_last.view(), dy_last.view(), dw_last.view(),
                                            nullptr, false);
      const double tolerance_here = dtype == DType::f64 ? 1e-13 : tolerance(dtype);
      EXPECT_LE(relative_error(rearrange(y_last.get(), rows, g.out_channels, false), y.get()), tolerance_here)
          << "forward " << what;
      EXPECT_LE(relative_error(rearrange(dx_last.get(), rows, g.in_channels, false), dx.get()), tolerance_here)
          << "backward data " << what;
      EXPECT_LE(relative_error(dw_last.get(), dw.get()), dtype == DType::f64 ? 1e-13 : 1e-5)
          << "backward weights " << what;
    }
}

TEST(SpatialLayout, PoolingIsBitIdenticalAcrossLayouts) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 2;
  const std::vector<SpatialGeometry> pools = {
      make_geometry(2, 3, 3, 1, {6, 7}, {2, 2}, {2, 2}, {0, 0}, {1, 1}),
      make_geometry(2, 5, 5, 1, {5, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}),
      make_geometry(3, 4, 4, 1, {4, 5, 6}, {2, 2, 3}, {2, 1, 3}, {1, 0, 1}, {1, 1, 1}),
      make_geometry(2, 4, 4, 1, {3, 5}, {3, 5}, {1, 1}, {0, 0}, {1, 1}),  // global average
  };
  for (const SpatialGeometry& g : pools)
    for (PoolingKind kind : {PoolingKind::max, PoolingKind::average})
      for (DType dtype : all_dtypes) {
        const std::int64_t channels = g.in_channels;
        const std::int64_t in_cols = channels * g.input_size(), out_cols = channels * g.output_size();
        TestTensor x(*backend, dtype, rows, in_cols), dy(*backend, dtype, rows, out_cols);
        auto x_values = x.randomize(71);
        x_values[5] = x_values[6];  // a tie: the first maximum must win in both layouts
        x.set(x_values);
        const auto dy_values = dy.randomize(72);
        TestTensor x_last(*backend, dtype, rows, in_cols), dy_last(*backend, dtype, rows, out_cols);
        x_last.set(rearrange(x_values, rows, channels, true));
        dy_last.set(rearrange(dy_values, rows, channels, true));
        TestTensor y(*backend, dtype, rows, out_cols), y_last(*backend, dtype, rows, out_cols);
        TestTensor dx(*backend, dtype, rows, in_cols), dx_last(*backend, dtype, rows, in_cols);
        y.poison(), y_last.poison(), dx.poison(), dx_last.poison();
        backend->pooling_forward(kind, with_layout(g, first), x.view(), y.view());
        backend->pooling_forward(kind, with_layout(g, last), x_last.view(), y_last.view());
        backend->pooling_backward(kind, with_layout(g, first), x.view(), dy.view(), dx.view());
        backend->pooling_backward(kind, with_layout(g, last), x_last.view(), dy_last.view(), dx_last.view());
        const std::string what = describe(g) + (kind == PoolingKind::max ? " max " : " average ") + dtype_name(dtype);
        EXPECT_FALSE(has_nan(y.get())) << what;
        EXPECT_FALSE(has_nan(dx.get())) << what;
        EXPECT_EQ(rearrange(y_last.get(), rows, channels, false), y.get()) << what;
        EXPECT_EQ(rearrange(dx_last.get(), rows, channels, false), dx.get()) << what;
      }
}

// 6 channels: single-channel loops; 60 in 6 groups: the channels-last loops' register blocks of every width (two
// vector registers, one, single channels, on AVX2 and AVX-512 alike) with groups that straddle them.
class GroupNormLayouts : public testing::TestWithParam<std::pair<std::int64_t, std::int64_t>> {};

TEST_P(GroupNormLayouts, AgreeAcrossLayouts) {
  auto backend = make_cpu_backend();
  const auto [channels, groups] = GetParam();
  const std::int64_t rows = 3, spatial = 37, cols = channels * spatial;
  SCOPED_TRACE(std::to_string(channels) + " channels in " + std::to_string(groups) + " groups");
  for (DType dtype : all_dtypes) {
    const DType master = master_of(dtype);
    TestTensor gamma(*backend, master, 1, channels), beta(*backend, master, 1, channels);
    gamma.randomize(81, 0.5, 1.5), beta.randomize(82);
    TestTensor x(*backend, dtype, rows, cols), dy(*backend, dtype, rows, cols);
    const auto x_values = x.randomize(83, -2, 3), dy_values = dy.randomize(84);
    TestTensor x_last(*backend, dtype, rows, cols), dy_last(*backend, dtype, rows, cols);
    x_last.set(rearrange(x_values, rows, channels, true));
    dy_last.set(rearrange(dy_values, rows, channels, true));
    TestTensor y(*backend, dtype, rows, cols), y_last(*backend, dtype, rows, cols);
    TestTensor dx(*backend, dtype, rows, cols), dx_last(*backend, dtype, rows, cols);
    TestTensor mean(*backend, master, rows, groups), rstd(*backend, master, rows, groups);
    TestTensor mean_last(*backend, master, rows, groups), rstd_last(*backend, master, rows, groups);
    TestTensor dgamma(*backend, master, 1, channels), dbeta(*backend, master, 1, channels);
    TestTensor dgamma_last(*backend, master, 1, channels), dbeta_last(*backend, master, 1, channels);
    for (TestTensor* output : {&y, &y_last, &dx, &dx_last, &dgamma, &dgamma_last, &dbeta, &dbeta_last})
      output->poison();
    backend->groupnorm_forward(channels, groups, first, x.view(), gamma.data(), beta.data(), 1e-5f, y.view(),
                               mean.data(), rstd.data());
    backend->groupnorm_forward(channels, groups, last, x_last.view(), gamma.data(), beta.data(), 1e-5f, y_last.view(),
                               mean_last.data(), rstd_last.data());
    backend->groupnorm_backward(channels, groups, first, x.view(), dy.view(), gamma.data(), mean.data(), rstd.data(),
                                dx.view(), dgamma.data(), dbeta.data(), false);
    backend->groupnorm_backward(channels, groups, last, x_last.view(), dy_last.view(), gamma.data(), mean_last.data(),
                                rstd_last.data(), dx_last.view(), dgamma_last.data(), dbeta_last.data(), false);
    const std::string what = dtype_name(dtype);
    // 16-bit outputs differ by at most one rounding where the fp32 sums differ in their last bits.
    const double bound = dtype == DType::f64 ? 1e-13 : (dtype == DType::f32 ? 1e-6 : tolerance(dtype));
    EXPECT_FALSE(has_nan(y.get()) || has_nan(dx.get()) || has_nan(dgamma.get())) << what;
    EXPECT_LE(relative_error(rearrange(y_last.get(), rows, channels, false), y.get()), bound) << what;
    EXPECT_LE(relative_error(rearrange(dx_last.get(), rows, channels, false), dx.get()), bound) << what;
    EXPECT_LE(relative_error(mean_last.get(), mean.get()), bound) << what;
    EXPECT_LE(relative_error(rstd_last.get(), rstd.get()), bound) << what;
    EXPECT_LE(relative_error(dgamma_last.get(), dgamma.get()), bound) << what;
    EXPECT_LE(relative_error(dbeta_last.get(), dbeta.get()), bound) << what;
    // Accumulation adds to the parameter gradients.
    backend->groupnorm_backward(channels, groups, last, x_last.view(), dy_last.view(), gamma.data(), mean_last.data(),
                                rstd_last.data(), dx_last.view(), dgamma_last.data(), dbeta_last.data(), true);
    auto twice = dbeta.get();
    for (auto& value : twice) value *= 2;
    EXPECT_LE(relative_error(dbeta_last.get(), twice), bound) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(SpatialLayout, GroupNormLayouts,
                         testing::Values(std::pair<std::int64_t, std::int64_t>{6, 3},
                                         std::pair<std::int64_t, std::int64_t>{60, 6}));

LayerSpec layer(const std::string& type, std::int64_t out = 0, std::vector<std::int64_t> kernel = {}) {
  LayerSpec spec;
  spec.type = *choice_named<LayerType>(type);
  spec.name = type + std::to_string(out);
  spec.out = out;
  spec.kernel = std::move(kernel);
  spec.padding = {1};
  if (type.find("pool") != std::string::npos) spec.padding = {0};
  spec.groups = type == "groupnorm" ? 2 : 1;
  spec.p = 0.5;
  return spec;
}

std::vector<LayerSpec> cnn(bool with_dropout, bool with_flatten) {
  std::vector<LayerSpec> layers = {layer("conv2d", 4, {3}), layer("relu"), layer("maxpool2d", 0, {2}),
                                   layer("groupnorm"), layer("conv2d", 4, {3})};
  if (with_dropout) layers.insert(layers.begin() + 2, layer("dropout"));
  if (with_flatten) {
    layers.push_back(layer("flatten"));
    layers.push_back(layer("linear", 3));
  }
  return layers;
}

// Runs one f64 forward and backward; returns (output, parameter gradients).
std::pair<std::vector<double>, std::vector<double>> step(SpatialLayout preferred, const std::vector<LayerSpec>& layers,
                                                         SpatialLayout* chosen) {
  auto backend = make_cpu_backend(preferred);
  ModelSection spec;
  spec.layers = layers;
  const std::int64_t rows = 3;
  const SampleShape sample{2, 6, 6};
  Model model(spec, sample, *backend, {DType::f64, DType::f64, rows}, "test.toml");
  model.initialize(5);
  *chosen = model.spatial_layout();
  const auto input = random_values(static_cast<std::size_t>(rows * shape_size(sample)), 91);
  backend->copy_to_backend(model.input(rows).data, input.data(), input.size() * sizeof(double));
  const std::vector<std::int64_t> ids{0, 1, 2};
  const StepContext context{backend.get(), true, 1, 0, ids.data(), rows};
  const TensorView output = model.forward(context);
  std::vector<double> result(static_cast<std::size_t>(output.size()));
  backend->copy_to_host(result.data(), output.data, result.size() * sizeof(double));
  // The loss gradient: the output itself (the gradient of half its squared norm).
  model.backward(context, false, nullptr);
  const auto* gradients = static_cast<const double*>(model.gradients());
  return {result, std::vector<double>(gradients, gradients + model.parameter_count())};
}

TEST(SpatialLayout, ModelsRunTheirConvStackChannelsLastWhereTheyCanWithTheSameResults) {
  SpatialLayout chosen_first{}, chosen_last{};
  const auto reference = step(first, cnn(false, true), &chosen_first);
  const auto result = step(last, cnn(false, true), &chosen_last);
  EXPECT_EQ(chosen_first, first);
  EXPECT_EQ(chosen_last, last);
  EXPECT_FALSE(has_nan(reference.first) || has_nan(reference.second));
  EXPECT_LE(relative_error(result.first, reference.first), 1e-13);
  EXPECT_LE(relative_error(result.second, reference.second), 1e-13);
  // Layouts the model keeps channels-first on a channels-last backend: a spatial output (losses and predictions would
  // see the layout) and dropout inside the conv stack (its mask is keyed by channels-first positions).
  SpatialLayout chosen{};
  step(last, cnn(false, false), &chosen);
  EXPECT_EQ(chosen, first) << "spatial output";
  step(last, cnn(true, true), &chosen);
  EXPECT_EQ(chosen, first) << "dropout in the conv stack";
}

}  // namespace
}  // namespace hpctrain
