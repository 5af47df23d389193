// gemm_ceiling: the practical FLOP-rate ceiling of one training step of an MLP, measured with oneDNN matmul primitives
// called directly (not through hpctrain's Backend), so that hpctrain's figure has an independent anchor.
//
// For every linear layer in -> out of the MLP at per-rank batch B it times the three products of a training step, in
// the layouts PyTorch and hpctrain store (W is (out, in), row-major; transposes are strides, never copies):
//   forward          y (B, out)  = x (B, in) x W^T + bias
//   backward-data    dx (B, in)  = dy (B, out) x W          (not for the first layer: its input needs no gradient)
//   backward-weight  dW (out, in) = dy^T (out, B) x x (B, in)
// fp32: everything fp32. bf16: inputs bf16, accumulation fp32; y and dx stored bf16 (they are the next products'
// inputs), dW stored fp32 (the optimizer's gradient), as in a mixed-precision step.
//
// Each repeat runs the step's products in step order (forward over the layers, then backward in reverse) and times
// every product alone; after the warm-up repeats, the median time of each product over the timed repeats gives its
// FLOP rate, and the sum of the step's FLOPs over the sum of those medians gives the step's ceiling: the rate a
// training step would reach if it did nothing but these matrix products.
//
// Output: a human-readable table per precision, then one machine-readable line per precision that bench/run.sh reads:
//   CEILING precision=fp32 batch=256 threads=2 flops_per_step=... seconds_per_step=... gflops=...
//   PHASES precision=fp32 batch=256 threads=2 forward_seconds=... backward_seconds=...   (the same medians, by phase)
//
// It also times the memory ceiling of the optimizer phase: one pass over a flat buffer of the model's parameter count
// with the memory traffic of hpctrain's optimizer phase (read the gradients for their norm; then read parameters,
// gradients and two moments, write parameters and moments, and in bf16 also the 16-bit working copy) but trivial
// arithmetic, so its time is what the traffic alone costs on this machine:
//   MEMORY precision=fp32 threads=2 elements=... bytes=... seconds=... gbps=...
// The pass repeats over the same buffers, so where the last-level cache holds them (the MLP's 113 MB of optimizer
// state in a 300 MiB L3) it measures that cache, not memory. A training step finds parameters and moments where the
// step before left them, after a forward and backward pass over other data, so the pass is timed a second way too:
// before each repeat the caches are flushed by reading a buffer of twice the last-level cache, then the gradients
// are read once (the backward pass has just written them):
//   MEMORY_COLD precision=fp32 threads=2 elements=... bytes=... seconds=... gbps=... flush_bytes=...
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "median_time.hpp"
#include "optimizer_memory_pass.hpp"

namespace {

using hpctrain::bench::median;

using Dims = dnnl::memory::dims;
using DataType = dnnl::memory::data_type;

struct Options {
  std::vector<std::int64_t> widths{1024, 2048, 2048, 10};  // input width, then every linear layer's out
  std::int64_t batch = 256;                                // rows per rank
  int threads = 0;                                         // 0: OMP_NUM_THREADS or the OpenMP default
  int warmup = 5;                                          // untimed repeats (primitive JIT, caches, page faults)
  int repeats = 30;                                        // timed repeats; medians over these
  std::vector<std::string> precisions{"fp32", "bf16"};
};

const char* const usage =
    "usage: gemm_ceiling [--widths 1024,2048,2048,10] [--batch 256] [--threads N] [--warmup 5] [--repeats 30]\n"
    "                    [--precision fp32,bf16]\n"
    "Times oneDNN matmuls of an MLP's training step (forward, backward-data, backward-weight per layer) and prints\n"
    "the median FLOP rate of each product and of the whole step. --threads 0 keeps OMP_NUM_THREADS / the default.\n";

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument("option " + arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--widths") {
      options.widths.clear();
      for (const auto& part : split(value)) options.widths.push_back(std::stoll(part));
      if (options.widths.size() < 2) throw std::invalid_argument("--widths needs at least two widths");
    } else if (arg == "--batch") {
      options.batch = std::stoll(value);
    } else if (arg == "--threads") {
      options.threads = std::stoi(value);
    } else if (arg == "--warmup") {
      options.warmup = std::stoi(value);
    } else if (arg == "--repeats") {
      options.repeats = std::stoi(value);
    } else if (arg == "--precision") {
      options.precisions = split(value);
      for (const auto& precision : options.precisions)
        if (precision != "fp32" && precision != "bf16")
          throw std::invalid_argument("--precision takes fp32 and/or bf16, got '" + precision + "'");
    } else {
      throw std::invalid_argument("unknown option " + arg + "\n" + usage);
    }
  }
  if (options.batch < 1 || options.repeats < 1 || options.warmup < 0)
    throw std::invalid_argument("--batch and --repeats must be >= 1, --warmup >= 0");
  return options;
}

// A (rows, cols) matrix stored row-major, or stored as its transpose (cols, rows): the strides say which.
dnnl::memory::desc matrix(std::int64_t rows, std::int64_t cols, bool stored_transposed, DataType type) {
  return {{rows, cols}, type, stored_transposed ? Dims{1, rows} : Dims{cols, 1}};
}

std::size_t bytes_of(DataType type) { return type == DataType::f32 ? 4 : 2; }

// One owned buffer holding a matrix of random values in [-1, 1) in the requested dtype. bf16 is fp32's upper half;
// truncation is fine for timing data, whose values only need to be finite and non-trivial.
struct Buffer {
  std::vector<std::uint16_t> storage;  // 16-bit units, so one type serves fp32 (two units) and bf16 (one)
  Buffer(std::int64_t elements, DataType type, std::mt19937& random) {
    storage.resize(static_cast<std::size_t>(elements) * bytes_of(type) / 2);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < elements; ++i) {
      const float value = uniform(random);
      if (type == DataType::f32) {
        std::memcpy(storage.data() + 2 * i, &value, sizeof value);
      } else {
        std::uint32_t bits;
        std::memcpy(&bits, &value, sizeof bits);
        storage[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(bits >> 16);
      }
    }
  }
  void* data() { return storage.data(); }
};

// One timed product: a created primitive with its operands.
struct Product {
  std::string name;
  double flops = 0.0;  // 2 m n k
  dnnl::matmul primitive;
  std::unordered_map<int, dnnl::memory> arguments;  // built once: the timed call does no setup
  std::vector<double> seconds;

  void run(dnnl::stream& stream) {
    primitive.execute(stream, arguments);
    stream.wait();
  }
};

// The step's products for one precision, in execution order. The operands' storage lives in `buffers` (moving a Buffer
// keeps its heap storage, so the memory objects' pointers stay valid).
std::vector<Product> build_step(const Options& options, bool bf16, const dnnl::engine& engine,
                                std::vector<Buffer>& buffers, std::mt19937& random) {
  const DataType input = bf16 ? DataType::bf16 : DataType::f32;
  const std::int64_t batch = options.batch;
  const std::size_t layers = options.widths.size() - 1;
  auto memory = [&](const dnnl::memory::desc& desc, std::int64_t elements, DataType type) {
    buffers.emplace_back(elements, type, random);
    return dnnl::memory(desc, engine, buffers.back().data());
  };
  auto create = [&](const std::string& name, std::int64_t m, std::int64_t n, std::int64_t k,
                    const dnnl::memory::desc& a, const dnnl::memory::desc& b, const dnnl::memory::desc& c,
                    DataType c_type, bool bias) {
    Product product;
    product.name = name;
    product.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const auto bias_desc = matrix(1, n, false, DataType::f32);
    const auto op = bias ? dnnl::matmul::desc(a, b, bias_desc, c) : dnnl::matmul::desc(a, b, c);
    const dnnl::matmul::primitive_desc descriptor(op, engine);
    product.primitive = dnnl::matmul(descriptor);
    product.arguments = {{DNNL_ARG_SRC, memory(a, m * k, input)},
                         {DNNL_ARG_WEIGHTS, memory(b, k * n, input)},
                         {DNNL_ARG_DST, memory(c, m * n, c_type)}};
    if (bias) product.arguments.emplace(DNNL_ARG_BIAS, memory(bias_desc, n, DataType::f32));
    return product;
  };

  std::vector<Product> forward, backward;
  for (std::size_t layer = 0; layer < layers; ++layer) {
    const std::int64_t in = options.widths[layer], out = options.widths[layer + 1];
    const std::string shape = std::to_string(in) + "->" + std::to_string(out);
    // forward: (B, in) x (out, in)^T -> (B, out), with bias; the output is the next layer's 16-bit input in bf16 runs
    forward.push_back(create("forward " + shape, batch, out, in, matrix(batch, in, false, input),
                             matrix(in, out, true, input), matrix(batch, out, false, input), input, true));
  }
  for (std::size_t layer = layers; layer-- > 0;) {
    const std::int64_t in = options.widths[layer], out = options.widths[layer + 1];
    const std::string shape = std::to_string(in) + "->" + std::to_string(out);
    // backward-weight: (B, out)^T x (B, in) -> (out, in), fp32 gradient
    backward.push_back(create("bwd-weight " + shape, out, in, batch, matrix(out, batch, true, input),
                              matrix(batch, in, false, input), matrix(out, in, false, DataType::f32), DataType::f32,
                              false));
    // backward-data: (B, out) x (out, in) -> (B, in); the first layer's input needs no gradient
    if (layer > 0)
      backward.push_back(create("bwd-data " + shape, batch, in, out, matrix(batch, out, false, input),
                                matrix(out, in, false, input), matrix(batch, in, false, input), input, false));
  }
  forward.insert(forward.end(), std::make_move_iterator(backward.begin()), std::make_move_iterator(backward.end()));
  return forward;
}

// Bytes that flush the caches when read: twice the last-level cache (64 MiB where the system does not say).
std::size_t flush_bytes() {
  const long last_level = std::max(sysconf(_SC_LEVEL3_CACHE_SIZE), sysconf(_SC_LEVEL2_CACHE_SIZE));
  return 2 * (last_level > 0 ? static_cast<std::size_t>(last_level) : std::size_t{32} << 20);
}

// Reads `values` on all threads (the flush, and the gradients' re-read); returns a sum so nothing is optimised away.
double read_all(const float* values, std::size_t count) {
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (std::size_t i = 0; i < count; i += 16) sum += values[i];
  return sum;
}

// The optimizer phase's memory traffic with trivial arithmetic (see the header); returns the median seconds. flush:
// with caches flushed before each repeat, the gradients read back in (MEMORY_COLD).
double optimizer_memory_pass(std::int64_t count, bool bf16, int warmup, int repeats, const std::vector<float>* flush) {
  std::vector<float> parameters(count, 0.5f), gradients(count, 0.25f), first(count, 0.125f), second(count, 0.0625f);
  std::vector<std::uint16_t> working(bf16 ? count : 0);
  std::vector<double> seconds;
  volatile double sink = 0.0;
  for (int repeat = 0; repeat < warmup + repeats; ++repeat) {
    if (flush != nullptr)
      sink =
          sink + read_all(flush->data(), flush->size()) + read_all(gradients.data(), static_cast<std::size_t>(count));
    const auto start = std::chrono::steady_clock::now();
    const double norm = hpctrain::bench::memory_norm_pass(gradients.data(), count);
    hpctrain::bench::memory_update_pass(parameters.data(), gradients.data(), first.data(), second.data(),
                                        bf16 ? working.data() : nullptr, count);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    sink = sink + norm;
    if (repeat >= warmup) seconds.push_back(elapsed.count());
  }
  return median(seconds);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options options = parse(argc, argv);
  if (options.threads > 0) omp_set_num_threads(options.threads);
  const int threads = omp_get_max_threads();
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::mt19937 random(12345);

  std::string widths;
  for (auto width : options.widths) {
    if (!widths.empty()) widths += '-';
    widths += std::to_string(width);
  }
  std::printf(
      "gemm_ceiling: oneDNN %d.%d.%d matmul, MLP %s, batch %lld per rank, %d thread%s, %d warm-up + %d timed "
      "repeats, medians\n",
      dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, widths.c_str(),
      static_cast<long long>(options.batch), threads, threads > 1 ? "s" : "", options.warmup, options.repeats);

  for (const std::string& precision : options.precisions) {
    const bool bf16 = precision == "bf16";
    std::vector<Buffer> buffers;
    std::vector<Product> step;
    try {
      step = build_step(options, bf16, engine, buffers, random);
    } catch (const dnnl::error& error) {
      // bf16 matmul needs AVX512-BF16/AMX or falls back to a reference kernel; a CPU without any path says so here.
      std::printf("%s: oneDNN could not create the products (%s); skipped\n", precision.c_str(), error.what());
      std::printf("CEILING precision=%s status=unavailable\n", precision.c_str());
      continue;
    }
    for (int repeat = 0; repeat < options.warmup + options.repeats; ++repeat) {
      for (Product& product : step) {
        const auto start = std::chrono::steady_clock::now();
        product.run(stream);
        const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
        if (repeat >= options.warmup) product.seconds.push_back(elapsed.count());
      }
    }
    double step_flops = 0.0, step_seconds = 0.0, forward_seconds = 0.0;
    std::printf("\n%s (inputs %s, accumulation fp32)\n  %-24s %10s %12s %10s\n", precision.c_str(), precision.c_str(),
                "product", "GFLOP", "median ms", "GFLOP/s");
    for (const Product& product : step) {
      const double seconds = median(product.seconds);
      step_flops += product.flops;
      step_seconds += seconds;
      if (product.name.rfind("forward", 0) == 0) forward_seconds += seconds;
      std::printf("  %-24s %10.3f %12.3f %10.1f\n", product.name.c_str(), product.flops * 1e-9, seconds * 1e3,
                  product.flops / seconds * 1e-9);
    }
    std::printf("  %-24s %10.3f %12.3f %10.1f\n", "step (sum of medians)", step_flops * 1e-9, step_seconds * 1e3,
                step_flops / step_seconds * 1e-9);
    std::printf("CEILING precision=%s batch=%lld threads=%d flops_per_step=%.0f seconds_per_step=%.6g gflops=%.2f\n",
                precision.c_str(), static_cast<long long>(options.batch), threads, step_flops, step_seconds,
                step_flops / step_seconds * 1e-9);
    // The limits of the step's forward and backward phases (bench/run.sh's roofline table).
    std::printf("PHASES precision=%s batch=%lld threads=%d forward_seconds=%.6g backward_seconds=%.6g\n",
                precision.c_str(), static_cast<long long>(options.batch), threads, forward_seconds,
                step_seconds - forward_seconds);

    std::int64_t parameters = 0;
    for (std::size_t layer = 1; layer < options.widths.size(); ++layer)
      parameters += options.widths[layer] * (options.widths[layer - 1] + 1);
    const double bytes = static_cast<double>(parameters) * hpctrain::bench::optimizer_pass_bytes_per_element(bf16);
    const double pass = optimizer_memory_pass(parameters, bf16, options.warmup, options.repeats, nullptr);
    std::printf("  optimizer-phase memory traffic, trivial arithmetic: %lld parameters, %.1f MB, %.3f ms, %.1f GB/s\n",
                static_cast<long long>(parameters), bytes * 1e-6, pass * 1e3, bytes / pass * 1e-9);
    std::printf("MEMORY precision=%s threads=%d elements=%lld bytes=%.0f seconds=%.6g gbps=%.2f\n", precision.c_str(),
                threads, static_cast<long long>(parameters), bytes, pass, bytes / pass * 1e-9);
    const std::vector<float> flush(flush_bytes() / sizeof(float), 1.0f);
    const double cold = optimizer_memory_pass(parameters, bf16, options.warmup, options.repeats, &flush);
    std::printf(
        "  the same, caches flushed before each repeat (%.0f MB read), gradients read back: %.3f ms, %.1f GB/s\n",
        static_cast<double>(flush.size() * sizeof(float)) * 1e-6, cold * 1e3, bytes / cold * 1e-9);
    std::printf("MEMORY_COLD precision=%s threads=%d elements=%lld bytes=%.0f seconds=%.6g gbps=%.2f flush_bytes=%zu\n",
                precision.c_str(), threads, static_cast<long long>(parameters), bytes, cold, bytes / cold * 1e-9,
                flush.size() * sizeof(float));
  }
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "gemm_ceiling: error: %s\n", error.what());
  return 2;
}
