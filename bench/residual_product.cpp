// The product that ends a residual branch with the block's add fused into it (Backend::linear_residual_forward, CPU:
// oneDNN's binary add post-op) against the product then the separate add (the composition the Model runs with
// HPCTRAIN_FUSE_RESIDUAL=0), side by side in alternating rounds: GPT-2 small's two branch ends, attention's c_proj
// (C -> C) and the MLP's c_proj (4C -> C), on rows = batch x T positions, fp32 and bf16. Each figure is the median over
// the rounds of each round's median over the repeats (bench/median_time.hpp).
//
//   residual_product [--rows 4096] [--width 768] [--rounds 5] [--repeats 20]     (threads: OMP_NUM_THREADS)
#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "median_time.hpp"

using namespace hpctrain;

namespace {
std::vector<char> random_tensor(Backend& backend, DType dtype, std::int64_t count, unsigned seed) {
  std::vector<float> values(static_cast<std::size_t>(count));
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal;
  for (float& value : values) value = normal(generator);
  std::vector<char> bytes(static_cast<std::size_t>(count) * dtype_size(dtype));
  backend.cast({values.data(), DType::f32, count, 1}, {bytes.data(), dtype, count, 1});
  return bytes;
}
}  // namespace

int main(int argc, char** argv) {
  std::int64_t rows = 4096, width = 768;
  int rounds = 5, repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string option = argv[i];
    const long value = std::strtol(argv[i + 1], nullptr, 10);
    if (option == "--rows")
      rows = value;
    else if (option == "--width")
      width = value;
    else if (option == "--rounds")
      rounds = static_cast<int>(value);
    else if (option == "--repeats")
      repeats = static_cast<int>(value);
    else {
      std::cerr << "residual_product: unknown option " << option << "\n";
      return 2;
    }
  }
  auto backend = make_cpu_backend();
  std::cout << "rows " << rows << ", C " << width << ", " << rounds << " rounds x " << repeats
            << " repeats; ms, median of the rounds' medians\n"
            << "dtype  product        fused  separate  separate/fused\n";
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const std::int64_t in : {width, 4 * width}) {
      auto x = random_tensor(*backend, dtype, rows * in, 1), weight = random_tensor(*backend, dtype, width * in, 2);
      auto skip = random_tensor(*backend, dtype, rows * width, 3), y = random_tensor(*backend, dtype, rows * width, 4);
      const auto bias = random_tensor(*backend, DType::f32, width, 5);
      const TensorView x_view{x.data(), dtype, rows, in}, weight_view{weight.data(), dtype, width, in},
          skip_view{skip.data(), dtype, rows, width}, y_view{y.data(), dtype, rows, width};
      std::vector<double> fused, separate;
      for (int round = 0; round < rounds; ++round) {
        fused.push_back(bench::median_ms(
            repeats, [&] { backend->linear_residual_forward(x_view, weight_view, bias.data(), skip_view, y_view); }));
        separate.push_back(bench::median_ms(repeats, [&] {
          backend->Backend::linear_residual_forward(x_view, weight_view, bias.data(), skip_view, y_view);
        }));
      }
      std::cout << std::left << std::setw(7) << dtype_name(dtype) << std::setw(14)
                << (std::to_string(in) + "->" + std::to_string(width)) << std::right << std::fixed
                << std::setprecision(3) << std::setw(7) << bench::median(fused) << std::setw(10)
                << bench::median(separate) << std::setw(16) << bench::median(separate) / bench::median(fused) << "\n";
    }
  return 0;
}
