// attention_kernels: hpctrain's CPU fused attention alone (Backend::attention_forward, and forward + backward), the
// kernel bench/attention.sh compares with PyTorch's F.scaled_dot_product_attention.
//
//   attention_kernels --sequence T [--batch 4] [--heads 12] [--head-dim 64] [--dtype fp32|bf16] [--not-causal]
//                     [--repeats 20] [--dropout P]
//
// Prints one line: "forward_ms F forward_backward_ms FB", each the median over the repeats after 3 warm-up calls, on
// OMP_NUM_THREADS threads. Inputs are random in [-1, 1). With --dropout P (attention dropout on the probabilities), a
// second line "dropout P forward_ms F forward_backward_ms FB" measured in the same run, right after the plain one.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "median_time.hpp"

namespace {

using hpctrain::DType;
using hpctrain::TensorView;
using hpctrain::bench::median_ms;

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr,
               "attention_kernels: %s\nusage: attention_kernels --sequence T [--batch B] [--heads H] "
               "[--head-dim D] [--dtype fp32|bf16] [--not-causal] [--repeats N] [--dropout P]\n",
               problem);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  hpctrain::AttentionGeometry g{4, 0, 12, 64, true, 0.0f, {}};
  DType dtype = DType::f32;
  int repeats = 20;
  float dropout = 0.0f;
  for (int i = 1; i < argc; ++i) {
    const std::string option = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("no value after " + option).c_str());
      return argv[++i];
    };
    if (option == "--sequence")
      g.sequence = std::stoll(value());
    else if (option == "--batch")
      g.batch = std::stoll(value());
    else if (option == "--heads")
      g.heads = std::stoll(value());
    else if (option == "--head-dim")
      g.head_dim = std::stoll(value());
    else if (option == "--repeats")
      repeats = std::stoi(value());
    else if (option == "--dropout")
      dropout = std::stof(value());
    else if (option == "--not-causal")
      g.causal = false;
    else if (option == "--dtype") {
      const std::string name = value();
      if (name == "fp32")
        dtype = DType::f32;
      else if (name == "bf16")
        dtype = DType::bf16;
      else
        usage("--dtype is fp32 or bf16");
    } else {
      usage(("unknown option " + option).c_str());
    }
  }
  if (g.sequence <= 0) usage("--sequence T is required");
  if (!(dropout >= 0.0f && dropout < 1.0f)) usage("--dropout P needs 0 <= P < 1");
  g.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));

  const auto backend = hpctrain::make_cpu_backend();
  const std::int64_t rows = g.batch * g.sequence;
  std::vector<float> random(static_cast<std::size_t>(rows * 3 * g.width()));
  std::mt19937 generator(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& value : random) value = uniform(generator);
  const auto tensor = [&](std::int64_t cols) {
    return TensorView{backend->allocate(static_cast<std::size_t>(rows * cols) * hpctrain::dtype_size(dtype)), dtype,
                      rows, cols};
  };
  const TensorView qkv = tensor(3 * g.width()), dqkv = tensor(3 * g.width()), out = tensor(g.width()),
                   dout = tensor(g.width());
  backend->upload_cast(random.data(), qkv);
  backend->upload_cast(random.data(), dout);
  void* lse = backend->allocate(static_cast<std::size_t>(g.batch * g.heads * g.sequence) * sizeof(float));

  std::vector<std::int64_t> samples(static_cast<std::size_t>(g.batch));
  for (std::size_t b = 0; b < samples.size(); ++b) samples[b] = static_cast<std::int64_t>(b);
  const auto measure = [&](const hpctrain::AttentionGeometry& geometry, const char* prefix) {
    const double forward = median_ms(repeats, [&] { backend->attention_forward(geometry, qkv, out, lse); });
    const double both = median_ms(repeats, [&] {
      backend->attention_forward(geometry, qkv, out, lse);
      backend->attention_backward(geometry, qkv, out, dout, lse, dqkv);
    });
    std::printf("%sforward_ms %.3f forward_backward_ms %.3f\n", prefix, forward, both);
  };
  measure(g, "");
  if (dropout > 0.0f) {
    hpctrain::AttentionGeometry dropped = g;
    dropped.dropout = {dropout, 1, 1, 0, samples.data()};
    const std::string prefix = "dropout " + std::to_string(dropout) + " ";
    measure(dropped, prefix.c_str());
  }
  for (const TensorView& view : {qkv, dqkv, out, dout}) backend->deallocate(view.data);
  backend->deallocate(lse);
  return 0;
}
