// Tests of the CPU backend's convolutional kernels: oneDNN convolutions (f32, bf16, and f16 through fp32) against the
// f64 loop reference on the same (dequantised) inputs, forward and both backward passes, over 2-D and 3-D geometries
// with stride, padding, dilation and groups; the f64 forward against a direct formula; primitive caching; pooling and
// group normalisation in every dtype against f64. Outputs are poisoned with NaN first, and a NaN never passes.
#include "../../src/kernels/cpu/cpu_convolution.hpp"  // the unit under test of the cache check (private to the backend)

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

std::vector<SpatialGeometry> geometries() {
  return {
      make_geometry(2, 3, 4, 1, {6, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 1}),
      make_geometry(2, 4, 6, 2, {9, 8}, {3, 2}, {2, 1}, {1, 0}, {2, 1}),
      make_geometry(2, 4, 4, 4, {5, 5}, {3, 3}, {1, 2}, {1, 1}, {1, 1}),  // depthwise
      make_geometry(2, 1, 8, 1, {12, 12}, {5, 5}, {1, 1}, {2, 2}, {1, 1}),
      make_geometry(3, 2, 4, 1, {5, 6, 4}, {3, 3, 3}, {1, 2, 1}, {1, 1, 1}, {1, 1, 1}),
      make_geometry(3, 4, 2, 2, {6, 5, 7}, {2, 3, 2}, {2, 1, 1}, {0, 1, 1}, {1, 1, 2}),
  };
}

std::int64_t weight_cols(const SpatialGeometry& g) { return g.in_channels / g.groups * g.kernel_size(); }

// y[n][oc][o] = b[oc] + sum over (ic in oc's group, taps) x * w, written with explicit D/H/W indices.
std::vector<double> direct_convolution(const SpatialGeometry& g, std::int64_t rows, const std::vector<double>& x,
                                       const std::vector<double>& w, const std::vector<double>& b) {
  const int missing = 3 - g.dimensions;
  std::array<std::int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, p{0, 0, 0}, d{1, 1, 1};
  for (int a = missing; a < 3; ++a) {
    const auto i = static_cast<std::size_t>(a), j = static_cast<std::size_t>(a - missing);
    in[i] = g.input[j], out[i] = g.output[j], k[i] = g.kernel[j], s[i] = g.stride[j], p[i] = g.padding[j],
    d[i] = g.dilation[j];
  }
  const std::int64_t group_in = g.in_channels / g.groups, group_out = g.out_channels / g.groups;
  std::vector<double> y(static_cast<std::size_t>(rows * g.out_channels * g.output_size()));
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t oc = 0; oc < g.out_channels; ++oc)
      for (std::int64_t od = 0; od < out[0]; ++od)
        for (std::int64_t oh = 0; oh < out[1]; ++oh)
          for (std::int64_t ow = 0; ow < out[2]; ++ow) {
            double sum = b[static_cast<std::size_t>(oc)];
            for (std::int64_t ic = 0; ic < group_in; ++ic)
              for (std::int64_t kd = 0; kd < k[0]; ++kd)
                for (std::int64_t kh = 0; kh < k[1]; ++kh)
                  for (std::int64_t kw = 0; kw < k[2]; ++kw) {
                    const std::int64_t id = od * s[0] - p[0] + kd * d[0], ih = oh * s[1] - p[1] + kh * d[1],
                                       iw = ow * s[2] - p[2] + kw * d[2];
                    if (id < 0 || ih < 0 || iw < 0 || id >= in[0] || ih >= in[1] || iw >= in[2]) continue;
                    const std::int64_t channel = oc / group_out * group_in + ic;
                    sum += x[static_cast<std::size_t>(
                               (((n * g.in_channels + channel) * in[0] + id) * in[1] + ih) * in[2] + iw)] *
                           w[static_cast<std::size_t>((((oc * group_in + ic) * k[0] + kd) * k[1] + kh) * k[2] + kw)];
                  }
            y[static_cast<std::size_t>((((n * g.out_channels + oc) * out[0] + od) * out[1] + oh) * out[2] + ow)] = sum;
          }
  return y;
}

TEST(CpuConvolution, DoubleLoopsMatchTheDirectFormula) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 2;
  for (const SpatialGeometry& g : geometries()) {
    TestTensor x(*backend, DType::f64, rows, g.in_channels * g.input_size());
    TestTensor w(*backend, DType::f64, g.out_channels, weight_cols(g));
    TestTensor y(*backend, DType::f64, rows, g.out_channels * g.output_size());
    TestArray<double> bias(*backend, random_values(static_cast<std::size_t>(g.out_channels), 5));
    const auto x_values = x.randomize(1), w_values = w.randomize(2);
    y.poison();
    backend->convolution_forward(g, x.view(), w.view(), bias.data(), y.view());
    EXPECT_LE(relative_error(y.get(), direct_convolution(g, rows, x_values, w_values, bias.get())), 1e-13)
        << describe(g);
  }
}

// oneDNN (f32, bf16; f16 through fp32) against the f64 loops on the same dequantised inputs.
TEST(CpuConvolution, OneDnnMatchesTheDoubleReference) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 3;
  for (const SpatialGeometry& g : geometries())
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      const std::int64_t in_cols = g.in_channels * g.input_size(), out_cols = g.out_channels * g.output_size();
      // Inputs in the dtype under test, and the same values in f64.
      TestTensor x(*backend, dtype, rows, in_cols), w(*backend, dtype, g.out_channels, weight_cols(g));
      TestTensor dy(*backend, dtype, rows, out_cols);
      const auto x_values = x.randomize(11), w_values = w.randomize(12), dy_values = dy.randomize(13);
      TestTensor x64(*backend, DType::f64, rows, in_cols), w64(*backend, DType::f64, g.out_channels, weight_cols(g));
      TestTensor dy64(*backend, DType::f64, rows, out_cols);
      x64.set(x_values), w64.set(w_values), dy64.set(dy_values);
      const auto bias_values = quantized(DType::f32, random_values(static_cast<std::size_t>(g.out_channels), 14));
      TestArray<float> bias(*backend, std::vector<float>(bias_values.begin(), bias_values.end()));
      TestArray<double> bias64(*backend, bias_values);
      const std::string what = describe(g) + " " + std::string(dtype_name(dtype));

      TestTensor y(*backend, dtype, rows, out_cols), y64(*backend, DType::f64, rows, out_cols);
      y.poison();
      backend->convolution_forward(g, x.view(), w.view(), bias.data(), y.view());
      backend->convolution_forward(g, x64.view(), w64.view(), bias64.data(), y64.view());
      EXPECT_LE(relative_error(y.get(), y64.get()), tolerance(dtype)) << "forward " << what;

      TestTensor dx(*backend, dtype, rows, in_cols), dx64(*backend, DType::f64, rows, in_cols);
      dx.poison();
      backend->convolution_backward_data(g, dy.view(), w.view(), dx.view());
      backend->convolution_backward_data(g, dy64.view(), w64.view(), dx64.view());
      EXPECT_LE(relative_error(dx.get(), dx64.get()), tolerance(dtype)) << "backward data " << what;

      // Weight and bias gradients are fp32 whatever the input dtype, formed in fp32 from exact 16-bit inputs.
      TestTensor dw(*backend, DType::f32, g.out_channels, weight_cols(g));
      TestTensor dw64(*backend, DType::f64, g.out_channels, weight_cols(g));
      TestArray<float> db(*backend, static_cast<std::size_t>(g.out_channels));
      TestArray<double> db64(*backend, static_cast<std::size_t>(g.out_channels));
      dw.poison();
      db.set(std::vector<float>(static_cast<std::size_t>(g.out_channels), NAN));
      backend->convolution_backward_weights(g, x.view(), dy.view(), dw.view(), db.data(), false);
      backend->convolution_backward_weights(g, x64.view(), dy64.view(), dw64.view(), db64.data(), false);
      EXPECT_LE(relative_error(dw.get(), dw64.get()), 1e-5) << "backward weights " << what;
      const auto db_values = db.get();
      EXPECT_LE(relative_error(std::vector<double>(db_values.begin(), db_values.end()), db64.get()), 1e-5)
          << "backward bias " << what;

      // Accumulation adds a second gradient.
      backend->convolution_backward_weights(g, x.view(), dy.view(), dw.view(), db.data(), true);
      auto twice = dw64.get();
      for (auto& value : twice) value *= 2;
      EXPECT_LE(relative_error(dw.get(), twice), 1e-5) << "accumulated weights " << what;
    }
}

// Both variants (plain layouts; oneDNN's blocked layouts with reorders), f32 and bf16, against the f64 loops.
TEST(CpuConvolution, BothLayoutVariantsMatchTheDoubleReference) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 2;
  for (auto layouts : {cpu::ConvolutionLayouts::plain, cpu::ConvolutionLayouts::preferred}) {
    cpu::CpuConvolution convolution(layouts);
    for (SpatialGeometry g : geometries()) {
      if (g.in_channels == 4 && g.out_channels == 6) g.out_channels = 16, g.groups = 1;  // a blocked-friendly shape
      for (DType dtype : {DType::f32, DType::bf16}) {
        const std::int64_t in_cols = g.in_channels * g.input_size(), out_cols = g.out_channels * g.output_size();
        TestTensor x(*backend, dtype, rows, in_cols), w(*backend, dtype, g.out_channels, weight_cols(g));
        TestTensor dy(*backend, dtype, rows, out_cols);
        TestTensor x64(*backend, DType::f64, rows, in_cols), w64(*backend, DType::f64, g.out_channels, weight_cols(g));
        TestTensor dy64(*backend, DType::f64, rows, out_cols);
        x64.set(x.randomize(51)), w64.set(w.randomize(52)), dy64.set(dy.randomize(53));
        const std::string what = describe(g) + " " + dtype_name(dtype) +
                                 (layouts == cpu::ConvolutionLayouts::plain ? " plain" : " preferred");
        TestTensor y(*backend, dtype, rows, out_cols), y64(*backend, DType::f64, rows, out_cols);
        TestTensor dx(*backend, dtype, rows, in_cols), dx64(*backend, DType::f64, rows, in_cols);
        TestTensor dw(*backend, DType::f32, g.out_channels, weight_cols(g));
        TestTensor dw64(*backend, DType::f64, g.out_channels, weight_cols(g));
        y.poison(), dx.poison(), dw.poison();
        convolution.forward(g, x.view(), w.view(), nullptr, y.view());
        convolution.backward_data(g, dy.view(), w.view(), dx.view());
        convolution.backward_weights(g, x.view(), dy.view(), dw.view(), nullptr, false);
        backend->convolution_forward(g, x64.view(), w64.view(), nullptr, y64.view());
        backend->convolution_backward_data(g, dy64.view(), w64.view(), dx64.view());
        backend->convolution_backward_weights(g, x64.view(), dy64.view(), dw64.view(), nullptr, false);
        EXPECT_LE(relative_error(y.get(), y64.get()), tolerance(dtype)) << "forward " << what;
        EXPECT_LE(relative_error(dx.get(), dx64.get()), tolerance(dtype)) << "backward data " << what;
        EXPECT_LE(relative_error(dw.get(), dw64.get()), 1e-5) << "backward weights " << what;
      }
    }
  }
}

TEST(CpuConvolution, LargerShapesUseTheOptimisedKernelsAndAgree) {
  auto backend = make_cpu_backend();
  const SpatialGeometry g = make_geometry(2, 16, 32, 1, {16, 16}, {3, 3}, {1, 1}, {1, 1}, {1, 1});
  const std::int64_t rows = 8, in_cols = g.in_channels * g.input_size(), out_cols = g.out_channels * g.output_size();
  for (DType dtype : {DType::f32, DType::bf16}) {
    TestTensor x(*backend, dtype, rows, in_cols), w(*backend, dtype, g.out_channels, weight_cols(g));
    TestTensor x64(*backend, DType::f64, rows, in_cols), w64(*backend, DType::f64, g.out_channels, weight_cols(g));
    x64.set(x.randomize(21));
    w64.set(w.randomize(22));
    TestTensor y(*backend, dtype, rows, out_cols), y64(*backend, DType::f64, rows, out_cols);
    y.poison();
    backend->convolution_forward(g, x.view(), w.view(), nullptr, y.view());
    backend->convolution_forward(g, x64.view(), w64.view(), nullptr, y64.view());
    EXPECT_LE(relative_error(y.get(), y64.get()), tolerance(dtype)) << dtype_name(dtype);
  }
}

TEST(CpuConvolution, PrimitivesAreCreatedOncePerConfiguration) {
  auto backend = make_cpu_backend();
  cpu::CpuConvolution convolution;
  const SpatialGeometry g = geometries()[1];
  const std::int64_t in_cols = g.in_channels * g.input_size(), out_cols = g.out_channels * g.output_size();
  TestTensor x(*backend, DType::f32, 4, in_cols), w(*backend, DType::f32, g.out_channels, weight_cols(g));
  TestTensor y(*backend, DType::f32, 4, out_cols), dw(*backend, DType::f32, g.out_channels, weight_cols(g));
  x.randomize(1), w.randomize(2);
  for (int repeat = 0; repeat < 3; ++repeat) {
    convolution.forward(g, x.view(), w.view(), nullptr, y.view());
    convolution.backward_data(g, y.view(), w.view(), x.view());
    convolution.backward_weights(g, x.view(), y.view(), dw.view(), nullptr, repeat > 0);
  }
  EXPECT_EQ(convolution.cached_primitives(), 3u);
  // A partial batch (fewer rows) is another configuration.
  convolution.forward(g, {x.data(), DType::f32, 2, in_cols}, w.view(), nullptr, {y.data(), DType::f32, 2, out_cols});
  EXPECT_EQ(convolution.cached_primitives(), 4u);
}

TEST(CpuPooling, EveryDtypeMatchesDoubleAndMaxPicksTheFirstMaximum) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 2;
  const std::vector<SpatialGeometry> pools = {
      make_geometry(2, 3, 3, 1, {6, 7}, {2, 2}, {2, 2}, {0, 0}, {1, 1}),
      make_geometry(2, 2, 2, 1, {5, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}),
      make_geometry(3, 2, 2, 1, {4, 5, 6}, {2, 2, 3}, {2, 1, 3}, {1, 0, 1}, {1, 1, 1}),
      make_geometry(2, 4, 4, 1, {3, 5}, {3, 5}, {1, 1}, {0, 0}, {1, 1}),  // global average
  };
  for (const SpatialGeometry& g : pools)
    for (PoolingKind kind : {PoolingKind::max, PoolingKind::average})
      for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
        const std::int64_t in_cols = g.in_channels * g.input_size(), out_cols = g.out_channels * g.output_size();
        TestTensor x(*backend, dtype, rows, in_cols), dy(*backend, dtype, rows, out_cols);
        TestTensor x64(*backend, DType::f64, rows, in_cols), dy64(*backend, DType::f64, rows, out_cols);
        x64.set(x.randomize(31));
        dy64.set(dy.randomize(32));
        TestTensor y(*backend, dtype, rows, out_cols), y64(*backend, DType::f64, rows, out_cols);
        TestTensor dx(*backend, dtype, rows, in_cols), dx64(*backend, DType::f64, rows, in_cols);
        y.poison(), dx.poison();
        backend->pooling_forward(kind, g, x.view(), y.view());
        backend->pooling_forward(kind, g, x64.view(), y64.view());
        backend->pooling_backward(kind, g, x.view(), dy.view(), dx.view());
        backend->pooling_backward(kind, g, x64.view(), dy64.view(), dx64.view());
        const std::string what = describe(g) + (kind == PoolingKind::max ? " max " : " average ") + dtype_name(dtype);
        EXPECT_LE(relative_error(y.get(), y64.get()), tolerance(dtype)) << what;
        EXPECT_LE(relative_error(dx.get(), dx64.get()), tolerance(dtype)) << what;
      }
  // Ties: the gradient goes to the first maximum of the window only; a NaN in a window propagates.
  const SpatialGeometry g = make_geometry(2, 1, 1, 1, {2, 2}, {2, 2}, {2, 2}, {0, 0}, {1, 1});
  TestTensor x(*backend, DType::f32, 2, 4), y(*backend, DType::f32, 2, 1), dy(*backend, DType::f32, 2, 1);
  TestTensor dx(*backend, DType::f32, 2, 4);
  x.set({1, 3, 3, 2, 1, NAN, 5, 2});
  dy.set({1, 1});
  backend->pooling_forward(PoolingKind::max, g, x.view(), y.view());
  backend->pooling_backward(PoolingKind::max, g, x.view(), dy.view(), dx.view());
  EXPECT_EQ(y.get()[0], 3.0);
  EXPECT_TRUE(std::isnan(y.get()[1]));
  EXPECT_EQ(dx.get(), (std::vector<double>{0, 1, 0, 0, 0, 1, 0, 0}));
}

TEST(CpuGroupNorm, EveryDtypeMatchesDoubleAndNormalisesEachGroup) {
  auto backend = make_cpu_backend();
  const std::int64_t rows = 3, channels = 6, groups = 3, spatial = 10, cols = channels * spatial;
  TestTensor x64(*backend, DType::f64, rows, cols), dy64(*backend, DType::f64, rows, cols);
  const auto gamma_values = random_values(channels, 41, 0.5, 1.5), beta_values = random_values(channels, 42);
  TestArray<double> gamma64(*backend, gamma_values), beta64(*backend, beta_values);
  TestArray<float> gamma(*backend, std::vector<float>(gamma_values.begin(), gamma_values.end()));
  TestArray<float> beta(*backend, std::vector<float>(beta_values.begin(), beta_values.end()));
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    TestTensor x(*backend, dtype, rows, cols), dy(*backend, dtype, rows, cols);
    x64.set(x.randomize(43, -2, 3));
    dy64.set(dy.randomize(44));
    TestTensor y(*backend, dtype, rows, cols), y64(*backend, DType::f64, rows, cols);
    TestTensor dx(*backend, dtype, rows, cols), dx64(*backend, DType::f64, rows, cols);
    TestArray<float> mean(*backend, rows * groups), rstd(*backend, rows * groups), dgamma(*backend, channels),
        dbeta(*backend, channels);
    TestArray<double> mean64(*backend, rows * groups), rstd64(*backend, rows * groups), dgamma64(*backend, channels),
        dbeta64(*backend, channels);
    y.poison(), dx.poison();
    backend->groupnorm_forward(channels, groups, SpatialLayout::channels_first, x.view(), gamma.data(), beta.data(),
                               1e-5f, y.view(), mean.data(), rstd.data());
    backend->groupnorm_forward(channels, groups, SpatialLayout::channels_first, x64.view(), gamma64.data(),
                               beta64.data(), 1e-5f, y64.view(), mean64.data(), rstd64.data());
    backend->groupnorm_backward(channels, groups, SpatialLayout::channels_first, x.view(), dy.view(), gamma.data(),
                                mean.data(), rstd.data(), dx.view(), dgamma.data(), dbeta.data(), false);
    backend->groupnorm_backward(channels, groups, SpatialLayout::channels_first, x64.view(), dy64.view(),
                                gamma64.data(), mean64.data(), rstd64.data(), dx64.view(), dgamma64.data(),
                                dbeta64.data(), false);
    EXPECT_LE(relative_error(y.get(), y64.get()), tolerance(dtype)) << dtype_name(dtype);
    EXPECT_LE(relative_error(dx.get(), dx64.get()), 2 * tolerance(dtype)) << dtype_name(dtype);
    const auto widen = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
    EXPECT_LE(relative_error(widen(dgamma.get()), dgamma64.get()), tolerance(dtype)) << dtype_name(dtype);
    EXPECT_LE(relative_error(widen(dbeta.get()), dbeta64.get()), tolerance(dtype)) << dtype_name(dtype);
  }
  // With gamma = 1, beta = 0 every (row, group) block has mean 0 and variance ~1.
  TestArray<double> ones(*backend, std::vector<double>(channels, 1.0)), zeros(*backend, std::vector<double>(channels));
  TestTensor y64(*backend, DType::f64, rows, cols);
  TestArray<double> mean64(*backend, rows * groups), rstd64(*backend, rows * groups);
  backend->groupnorm_forward(channels, groups, SpatialLayout::channels_first, x64.view(), ones.data(), zeros.data(),
                             0.0f, y64.view(), mean64.data(), rstd64.data());
  const auto y = y64.get();
  const std::int64_t block = cols / groups;
  for (std::int64_t b = 0; b < rows * groups; ++b) {
    double sum = 0, squares = 0;
    for (std::int64_t i = 0; i < block; ++i) sum += y[static_cast<std::size_t>(b * block + i)];
    for (std::int64_t i = 0; i < block; ++i) squares += std::pow(y[static_cast<std::size_t>(b * block + i)], 2);
    EXPECT_NEAR(sum / static_cast<double>(block), 0.0, 1e-12);
    EXPECT_NEAR(squares / static_cast<double>(block), 1.0, 1e-9);
  }
}

// A backend that implements only the required operations: the convolutional ones keep their defaults.
struct Minimal : Backend {
  std::string name() const override { return "minimal"; }
  void* allocate(std::size_t) override { return nullptr; }
  void deallocate(void*) override {}
  void copy_to_backend(void*, const void*, std::size_t) override {}
  void copy_to_host(void*, const void*, std::size_t) override {}
  void copy(void*, const void*, std::size_t) override {}
  void zero(void*, std::size_t) override {}
  void synchronize() override {}
  void cast(const TensorView&, const TensorView&) override {}
  void gemm(const TensorView&, bool, const TensorView&, bool, const TensorView&, const void*, bool) override {}
  void bias_gradient(const TensorView&, void*, DType, bool) override {}
  void activation_forward(Activation, float, const TensorView&, const TensorView&) override {}
  void activation_backward(Activation, float, const TensorView&, const TensorView&, const TensorView&) override {}
  void dropout_forward(float, std::uint64_t, std::uint32_t, std::uint32_t, const std::int64_t*, const TensorView&,
                       const TensorView&) override {}
  void dropout_backward(float, std::uint64_t, std::uint32_t, std::uint32_t, const std::int64_t*, const TensorView&,
                        const TensorView&) override {}
  void layernorm_forward(const TensorView&, const void*, const void*, float, const TensorView&, void*, void*) override {
  }
  void layernorm_backward(const TensorView&, const TensorView&, const void*, const void*, const void*,
                          const TensorView&, void*, void*, bool) override {}
  void softmax_cross_entropy(const TensorView&, const std::int32_t*, const float*, const TensorView&,
                             LossSums*) override {}
  void mean_squared_error(const TensorView&, const void*, const float*, const TensorView&, LossSums*) override {}
  void gradient_statistics(const float*, std::int64_t, const OptimizerHyper&, StepScalars*) override {}
  void optimizer_step(const OptimizerHyper&, bool, float*, const float*, float*, float*, std::int64_t,
                      const TensorView&, const StepScalars*) override {}
  void finish_step(const LossScalerConfig&, StepScalars*) override {}
  void loss_gradient_scale(const StepScalars*, float, const float*, float*) override {}
};

TEST(CpuConvolution, NotSupportedByDefault) {
  // A backend that does not override the convolutional operations reports them as not supported.
  Minimal minimal;
  try {
    minimal.convolution_forward({}, {}, {}, nullptr, {});
    FAIL() << "no exception";
  } catch (const NotSupported& error) {
    EXPECT_NE(std::string(error.what()).find("on the minimal backend"), std::string::npos) << error.what();
  }
  EXPECT_THROW(minimal.pooling_forward(PoolingKind::max, {}, {}, {}), NotSupported);
  EXPECT_THROW(
      minimal.groupnorm_forward(1, 1, SpatialLayout::channels_first, {}, nullptr, nullptr, 0.0f, {}, nullptr, nullptr),
      NotSupported);
}

TEST(CpuConvolution, ModelRefusesSpatialLayersTheBackendLacks) {
  // At set-up, before any buffer is allocated: the deck position, the layer and what to do.
  Minimal minimal;
  ModelSection spec;
  LayerSpec conv;
  conv.type = LayerType::conv2d;
  conv.name = "features";
  conv.out = 4;
  conv.kernel = {3};
  LayerSpec head;
  head.type = LayerType::linear;
  head.name = "head";
  head.out = 2;
  spec.layers = {conv, head};
  try {
    Model model(spec, SampleShape{1, 8, 8}, minimal, {DType::f32, DType::f32, 4}, "deck.toml");
    FAIL() << "no exception";
  } catch (const NotSupported& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("layer 'features' (conv2d) on the minimal backend"), std::string::npos) << message;
    EXPECT_NE(message.find("run.device = \"cpu\""), std::string::npos) << message;
  }
  EXPECT_TRUE(make_cpu_backend()->has_spatial_operations());
}

}  // namespace
}  // namespace hpctrain
