// spatial_kernels: hpctrain's CPU convolution and max-pooling kernels against oneDNN 2.6 primitives called directly,
// side by side in one run, on the layers of inputs/cosmoflow-small.toml (per-rank batch 32) and one larger 3-D layer.
//
// Convolution: hpctrain's Backend (channels-last rows, PyTorch-shaped weights, what a training step calls) against
// the raw primitive on the same channels-last memory with weights already in oneDNN's layout (no reorders at all:
// the ceiling of what hpctrain can reach through oneDNN), forward + backward-data + backward-weights; and hpctrain on
// channels-first rows (HPCTRAIN_SPATIAL_LAYOUT=channels_first, i.e. oneDNN's blocked layout reached through reorders
// of every operand on every call), so the table shows what channels-last gains.
// Max pooling, kernel 2 / stride 2 (the decks' 3-D and 2-D pooling layers, channels-last and channels-first): hpctrain
// as a training step calls it (the forward keeps each output's argmax, the backward reads it) against oneDNN's pooling
// primitive on the same memory (forward training, which writes the workspace its backward reads), called in
// alternation; "speed" is oneDNN's time over hpctrain's (>= 1: hpctrain is faster).
//
// Times are medians over 30 repeats after 3 warm-up calls (rounds), on OMP_NUM_THREADS threads. Output: one table.
// --quick: 3 repeats and only the small layers (checks the program, measures nothing). --pooling: only the max-pooling
// table (the convolution rows take most of the run).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "median_time.hpp"

namespace {

using hpctrain::DType;
using hpctrain::SpatialGeometry;
using hpctrain::SpatialLayout;
using hpctrain::TensorView;
using Tag = dnnl::memory::format_tag;
using DnnlType = dnnl::memory::data_type;

int timed_repeats = 30;

double median_ms(const std::function<void()>& call) { return hpctrain::bench::median_ms(timed_repeats, call); }

// Each call timed once per round, the calls in turn, 3 warm-up rounds; each call's median over the timed rounds.
std::vector<double> alternating_medians_ms(const std::vector<std::function<void()>>& calls) {
  std::vector<std::vector<double>> times(calls.size());
  for (int repeat = 0; repeat < timed_repeats + 3; ++repeat)
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      calls[i]();
      const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
      if (repeat >= 3) times[i].push_back(elapsed.count());
    }
  std::vector<double> medians;
  for (auto& series : times) {
    std::sort(series.begin(), series.end());
    medians.push_back(series[series.size() / 2]);
  }
  return medians;
}

std::vector<float> random_floats(std::size_t count, unsigned seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (auto& value : values) value = uniform(generator);
  return values;
}

struct Layer {
  const char* name;
  std::int64_t rows, in_channels, out_channels, extent;  // 3-D, cubic, kernel 3 padding 1 (conv) or 2 / 2 (pool)
};

dnnl::memory::dims volume(std::int64_t rows, std::int64_t channels, std::int64_t extent) {
  return {rows, channels, extent, extent, extent};
}

// The three convolutions of a training step through oneDNN directly: channels-last activations, weights in the
// layout oneDNN picks (reordered once, outside the timing).
double raw_convolution_ms(const Layer& layer, const std::vector<float>& x, const std::vector<float>& dy,
                          std::vector<float>& y, std::vector<float>& dx) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc source(volume(layer.rows, layer.in_channels, layer.extent), DnnlType::f32, Tag::ndhwc);
  const dnnl::memory::desc destination(volume(layer.rows, layer.out_channels, layer.extent), DnnlType::f32, Tag::ndhwc);
  const dnnl::memory::dims weight_dims{layer.out_channels, layer.in_channels, 3, 3, 3};
  const dnnl::memory::desc weights_any(weight_dims, DnnlType::f32, Tag::any);
  const dnnl::memory::desc weights_plain(weight_dims, DnnlType::f32, Tag::oidhw);
  const dnnl::memory::dims strides{1, 1, 1}, dilations{0, 0, 0}, padding{1, 1, 1};
  const auto direct = dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::primitive_desc forward(
      {dnnl::prop_kind::forward_training, direct, source, weights_any, destination, strides, dilations, padding,
       padding},
      engine);
  const dnnl::convolution_backward_data::primitive_desc backward_data(
      {direct, source, weights_any, destination, strides, dilations, padding, padding}, engine, forward);
  const dnnl::convolution_backward_weights::primitive_desc backward_weights(
      {direct, source, weights_any, destination, strides, dilations, padding, padding}, engine, forward);
  std::vector<float> w = random_floats(static_cast<std::size_t>(layer.out_channels * layer.in_channels * 27), 3);
  dnnl::memory user_weights(weights_plain, engine, w.data());
  dnnl::memory weights(forward.weights_desc(), engine);
  dnnl::reorder(user_weights, weights).execute(stream, user_weights, weights);
  dnnl::memory weights_for_data(backward_data.weights_desc(), engine);
  dnnl::reorder(user_weights, weights_for_data).execute(stream, user_weights, weights_for_data);
  dnnl::memory weight_gradient(backward_weights.diff_weights_desc(), engine);
  dnnl::memory src(source, engine, const_cast<float*>(x.data())), dst(destination, engine, y.data());
  dnnl::memory diff_dst(destination, engine, const_cast<float*>(dy.data())), diff_src(source, engine, dx.data());
  const dnnl::convolution_forward run_forward(forward);
  const dnnl::convolution_backward_data run_data(backward_data);
  const dnnl::convolution_backward_weights run_weights(backward_weights);
  return median_ms([&] {
    run_forward.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    run_data.execute(
        stream, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, weights_for_data}, {DNNL_ARG_DIFF_SRC, diff_src}});
    run_weights.execute(stream,
                        {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, weight_gradient}});
    stream.wait();
  });
}

SpatialGeometry convolution_geometry(const Layer& layer, SpatialLayout layout) {
  SpatialGeometry g;
  g.dimensions = 3;
  g.in_channels = layer.in_channels;
  g.out_channels = layer.out_channels;
  for (std::size_t a = 0; a < 3; ++a) {
    g.input[a] = g.output[a] = layer.extent;
    g.kernel[a] = 3;
    g.stride[a] = g.padding[a] = g.dilation[a] = 1;
  }
  g.layout = layout;
  return g;
}

// The same three convolutions through hpctrain's Backend, on rows of the given layout.
double backend_convolution_ms(hpctrain::Backend& backend, const Layer& layer, SpatialLayout layout,
                              const std::vector<float>& x, const std::vector<float>& dy, std::vector<float>& y,
                              std::vector<float>& dx, std::vector<float>& dw) {
  const SpatialGeometry g = convolution_geometry(layer, layout);
  std::vector<float> w = random_floats(static_cast<std::size_t>(layer.out_channels * layer.in_channels * 27), 3);
  const std::int64_t in_cols = g.in_channels * g.input_size(), out_cols = g.out_channels * g.output_size();
  const TensorView input{const_cast<float*>(x.data()), DType::f32, layer.rows, in_cols};
  const TensorView output{y.data(), DType::f32, layer.rows, out_cols};
  const TensorView gradient{const_cast<float*>(dy.data()), DType::f32, layer.rows, out_cols};
  const TensorView input_gradient{dx.data(), DType::f32, layer.rows, in_cols};
  const TensorView weights{w.data(), DType::f32, layer.out_channels, layer.in_channels * 27};
  const TensorView weight_gradient{dw.data(), DType::f32, layer.out_channels, layer.in_channels * 27};
  return median_ms([&] {
    backend.convolution_forward(g, input, weights, nullptr, output);
    backend.convolution_backward_data(g, gradient, weights, input_gradient);
    backend.convolution_backward_weights(g, input, gradient, weight_gradient, nullptr, false);
  });
}

// One max-pooling layer, kernel 2 / stride 2 in every spatial axis (2-D or 3-D, cubic or square).
struct Pool {
  const char* name;
  std::int64_t rows, channels, extent;
  int dimensions;
};

dnnl::memory::dims pool_dims(const Pool& pool, std::int64_t extent) {
  dnnl::memory::dims dims{pool.rows, pool.channels};
  for (int a = 0; a < pool.dimensions; ++a) dims.push_back(extent);
  return dims;
}

Tag pool_tag(int dimensions, SpatialLayout layout) {
  const bool last = layout == SpatialLayout::channels_last;
  if (dimensions == 2) return last ? Tag::nhwc : Tag::nchw;
  return last ? Tag::ndhwc : Tag::ncdhw;
}

struct PoolTimes {
  double forward, backward;
};

// hpctrain's max pooling as a training step calls it (max_pooling_forward keeping the argmax, max_pooling_backward
// reading it) and oneDNN's primitive on the same memory (forward training, which writes the workspace its backward
// reads), called in alternation so that load from elsewhere hits both alike. Medians over the repeats.
std::pair<PoolTimes, PoolTimes> pooling_ms(hpctrain::Backend& backend, const Pool& pool, SpatialLayout layout) {
  const std::int64_t out_extent = pool.extent / 2;
  std::int64_t in_size = 1, out_size = 1;
  for (int a = 0; a < pool.dimensions; ++a) in_size *= pool.extent, out_size *= out_extent;
  const auto in_count = static_cast<std::size_t>(pool.rows * pool.channels * in_size);
  const auto out_count = static_cast<std::size_t>(pool.rows * pool.channels * out_size);
  const auto x = random_floats(in_count, 1), dy = random_floats(out_count, 2);
  std::vector<float> y(out_count), dx(in_count);
  std::vector<std::int32_t> argmax(out_count);

  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const Tag tag = pool_tag(pool.dimensions, layout);
  const dnnl::memory::desc source(pool_dims(pool, pool.extent), DnnlType::f32, tag);
  const dnnl::memory::desc destination(pool_dims(pool, out_extent), DnnlType::f32, tag);
  const dnnl::memory::dims window(static_cast<std::size_t>(pool.dimensions), 2),
      none(static_cast<std::size_t>(pool.dimensions), 0);
  const dnnl::pooling_forward::primitive_desc forward({dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max,
                                                       source, destination, window, window, none, none},
                                                      engine);
  const dnnl::pooling_backward::primitive_desc backward(
      {dnnl::algorithm::pooling_max, source, destination, window, window, none, none}, engine, forward);
  dnnl::memory src(source, engine, const_cast<float*>(x.data())), dst(destination, engine, y.data());
  dnnl::memory diff_dst(destination, engine, const_cast<float*>(dy.data())), diff_src(source, engine, dx.data());
  dnnl::memory workspace(forward.workspace_desc(), engine);
  const dnnl::pooling_forward run_forward(forward);
  const dnnl::pooling_backward run_backward(backward);

  SpatialGeometry g;
  g.dimensions = pool.dimensions;
  g.in_channels = g.out_channels = pool.channels;
  for (std::size_t a = 0; a < static_cast<std::size_t>(pool.dimensions); ++a) {
    g.input[a] = pool.extent;
    g.output[a] = out_extent;
    g.kernel[a] = g.stride[a] = 2;
    g.dilation[a] = 1;
  }
  g.layout = layout;
  const TensorView input{const_cast<float*>(x.data()), DType::f32, pool.rows, pool.channels * in_size};
  const TensorView output{y.data(), DType::f32, pool.rows, pool.channels * out_size};
  const TensorView gradient{const_cast<float*>(dy.data()), DType::f32, pool.rows, pool.channels * out_size};
  const TensorView input_gradient{dx.data(), DType::f32, pool.rows, pool.channels * in_size};

  const std::vector<std::function<void()>> calls = {
      [&] {
        run_forward.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}, {DNNL_ARG_WORKSPACE, workspace}});
        stream.wait();
      },
      [&] { backend.max_pooling_forward(g, input, output, argmax.data()); },
      [&] {
        run_backward.execute(
            stream, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}, {DNNL_ARG_WORKSPACE, workspace}});
        stream.wait();
      },
      [&] { backend.max_pooling_backward(g, input, gradient, argmax.data(), input_gradient); },
  };
  const std::vector<double> medians = alternating_medians_ms(calls);
  return {{medians[0], medians[2]}, {medians[1], medians[3]}};
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, pooling_only = false;
  std::string only;  // --only TEXT: the pooling rows whose name contains TEXT (for perf record of one shape)
  int repeats = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "--quick") {
      quick = true;
    } else if (option == "--pooling") {
      pooling_only = true;
    } else if (option == "--only" && i + 1 < argc) {
      only = argv[++i];
      pooling_only = true;
    } else if (option == "--repeats" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      repeats = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: spatial_kernels [--quick] [--pooling] [--only TEXT] [--repeats N]\n");
      return 2;
    }
  }
  if (quick) timed_repeats = 3;
  if (repeats > 0) timed_repeats = repeats;
  std::vector<Layer> layers = {
      {"cosmoflow-small conv1", 32, 2, 8, 16},
      {"cosmoflow-small conv2", 32, 8, 16, 8},
      {"cosmoflow-small conv3", 32, 16, 16, 4},
  };
  std::vector<Pool> pools = {{"cosmoflow-small pool1", 32, 8, 16, 3},
                             {"cosmoflow-small pool2", 32, 16, 8, 3},
                             {"cnn2d pool1", 64, 8, 16, 2},
                             {"cnn2d pool2", 64, 16, 8, 2}};
  if (!quick) {
    layers.push_back({"cosmoflow conv2 (2 samples)", 2, 32, 64, 32});
    pools.push_back({"cosmoflow pool2 (2 samples)", 2, 64, 32, 3});
  }
  auto backend = hpctrain::make_cpu_backend(SpatialLayout::channels_last);
  std::printf("spatial_kernels: %d threads, f32, medians of %d (ms)\n", omp_get_max_threads(), timed_repeats);
  if (pooling_only) layers.clear();
  if (!layers.empty())
    std::printf("%-30s %12s %12s %8s %16s %8s\n", "convolution fwd+bwd", "oneDNN raw", "hpctrain", "of raw",
                "channels-first", "gain");
  for (const Layer& layer : layers) {
    const auto in_count =
        static_cast<std::size_t>(layer.rows * layer.in_channels * layer.extent * layer.extent * layer.extent);
    const auto out_count =
        in_count / static_cast<std::size_t>(layer.in_channels) * static_cast<std::size_t>(layer.out_channels);
    const auto x = random_floats(in_count, 1), dy = random_floats(out_count, 2);
    std::vector<float> y(out_count), dx(in_count),
        dw(static_cast<std::size_t>(layer.out_channels * layer.in_channels * 27));
    const double raw = raw_convolution_ms(layer, x, dy, y, dx);
    const double mine = backend_convolution_ms(*backend, layer, SpatialLayout::channels_last, x, dy, y, dx, dw);
    const double first = backend_convolution_ms(*backend, layer, SpatialLayout::channels_first, x, dy, y, dx, dw);
    std::printf("%-30s %12.3f %12.3f %7.0f%% %16.3f %7.2fx\n", layer.name, raw, mine, 100.0 * raw / mine, first,
                first / mine);
  }
  std::printf("%-36s %10s %10s %7s %10s %10s %7s\n", "max pooling 2/2 (fwd keeps argmax)", "oneDNN fwd", "mine fwd",
              "speed", "oneDNN bwd", "mine bwd", "speed");
  for (const SpatialLayout layout : {SpatialLayout::channels_last, SpatialLayout::channels_first}) {
    auto pool_backend = hpctrain::make_cpu_backend(layout);
    for (const Pool& pool : pools) {
      const std::string name = std::string(pool.name) + (layout == SpatialLayout::channels_last ? ", last" : ", first");
      if (name.find(only) == std::string::npos) continue;
      const auto [raw, mine] = pooling_ms(*pool_backend, pool, layout);
      std::printf("%-36s %10.3f %10.3f %6.2fx %10.3f %10.3f %6.2fx\n", name.c_str(), raw.forward, mine.forward,
                  raw.forward / mine.forward, raw.backward, mine.backward, raw.backward / mine.backward);
    }
  }
  return 0;
}
