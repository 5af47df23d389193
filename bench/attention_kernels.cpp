// attention_kernels: hpctrain's CPU fused attention alone (Backend::attention_forward, and forward + backward), the
// kernel bench/attention.sh compares with PyTorch's F.scaled_dot_product_attention.
//
//   attention_kernels --sequence T [--batch 4] [--heads 12] [--head-dim 64] [--dtype fp32|bf16] [--not-causal]
//                     [--repeats 20]
//
// Prints one line: "forward_ms F forward_backward_ms FB", each the median over the repeats after 3 warm-up calls, on
// OMP_NUM_THREADS threads. Inputs are random in [-1, 1).
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
               "[--head-dim D] [--dtype fp32|bf16] [--not-causal] [--repeats N]\n",
               problem);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  hpctrain::AttentionGeometry g{4, 0, 12, 64, true, 0.0f};
  DType dtype = DType::f32;
  int repeats = 20;
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

  const double forward = median_ms(repeats, [&] { backend->attention_forward(g, qkv, out, lse); });
  const double both = median_ms(repeats, [&] {
    backend->attention_forward(g, qkv, out, lse);
    backend->attention_backward(g, qkv, out, dout, lse, dqkv);
  });
  std::printf("forward_ms %.3f forward_backward_ms %.3f\n", forward, both);
  for (const TensorView& view : {qkv, dqkv, out, dout}) backend->deallocate(view.data);
  backend->deallocate(lse);
  return 0;
}
