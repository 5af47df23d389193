// optimizer_pass: hpctrain's optimizer phase (Backend::gradient_statistics, then Backend::optimizer_step with AdamW on
// fp32 master weights, without and with the bf16 working copy) against a pass with the same memory traffic and
// trivial arithmetic (optimizer_memory_pass.hpp, also gemm_ceiling's MEMORY line), on a flat buffer of the benchmark
// MLP's parameter count. Each round times every call once, in turn (so load from elsewhere hits all of them alike);
// figures are medians over the rounds. The norm and the update are also timed apart, against the pass's two halves.
//
//   optimizer_pass [--elements N] [--rounds R]
// Output: a table, then one line per precision that bench/run.sh reads:
//   OPTIMIZER precision=fp32 threads=2 elements=... bytes=... hpctrain_seconds=... pass_seconds=... ratio=...
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "optimizer_memory_pass.hpp"

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t count = 1024 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10;  // the MLP 1024-2048-2048-10
  int rounds = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--elements" && i + 1 < argc) {
      count = std::stoll(argv[++i]);
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::stoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: optimizer_pass [--elements N] [--rounds R]\n");
      return 2;
    }
  }
  if (count < 1 || rounds < 1) {
    std::fprintf(stderr, "optimizer_pass: --elements and --rounds must be positive\n");
    return 2;
  }
  const auto size = static_cast<std::size_t>(count);
  std::mt19937 generator(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> parameters(size), gradients(size), first(size), second(size);
  for (std::size_t i = 0; i < size; ++i) {
    parameters[i] = normal(generator) * 100.0f;
    gradients[i] = normal(generator);
    first[i] = normal(generator) * 0.1f;
    second[i] = gradients[i] * gradients[i];
  }
  std::vector<std::uint16_t> working(size);
  const auto backend = hpctrain::make_cpu_backend();
  hpctrain::OptimizerHyper hyper;
  hyper.weight_decay = 0.01f;
  hyper.max_grad_norm = 1.0f;
  hpctrain::StepScalars scalars;
  scalars.learning_rate = 1e-4f;
  scalars.applied_steps = 100;  // constant: every round does the same arithmetic on similar values
  const hpctrain::TensorView no_copy{nullptr, hpctrain::DType::f32, count, 1};
  const hpctrain::TensorView bf16_copy{working.data(), hpctrain::DType::bf16, count, 1};
  const auto norm = [&] { backend->gradient_statistics(gradients.data(), count, hyper, &scalars); };
  const auto update = [&](const hpctrain::TensorView& copy) {
    backend->optimizer_step(hyper, true, parameters.data(), gradients.data(), first.data(), second.data(), count, copy,
                            &scalars);
  };
  volatile double sink = 0.0;
  const auto pass_norm = [&] { sink = sink + hpctrain::bench::memory_norm_pass(gradients.data(), count); };
  const auto pass_update = [&](bool copy) {
    hpctrain::bench::memory_update_pass(parameters.data(), gradients.data(), first.data(), second.data(),
                                        copy ? working.data() : nullptr, count);
  };
  // Names and calls, timed in turn every round.
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"hpctrain norm", norm},
      {"pass norm", pass_norm},
      {"hpctrain update fp32", [&] { update(no_copy); }},
      {"pass update fp32", [&] { pass_update(false); }},
      {"hpctrain update bf16", [&] { update(bf16_copy); }},
      {"pass update bf16", [&] { pass_update(true); }},
  };
  std::vector<std::vector<double>> seconds(calls.size());
  for (int round = 0; round < rounds + 3; ++round)
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      calls[i].second();
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      if (round >= 3) seconds[i].push_back(elapsed.count());  // 3 warm-up rounds (page faults, caches)
    }
  std::vector<double> medians;
  for (const auto& series : seconds) medians.push_back(median(series));
  const int threads = omp_get_max_threads();
  std::printf("optimizer_pass: %lld elements, %d threads, medians of %d rounds (ms)\n", static_cast<long long>(count),
              threads, rounds);
  std::printf("  %-24s %10.3f   pass %10.3f   ratio %.2f\n", "gradient norm", medians[0] * 1e3, medians[1] * 1e3,
              medians[1] / medians[0]);
  for (const int precision : {0, 1}) {
    const bool bf16 = precision == 1;
    const double mine_update = medians[2 + 2 * precision], pass_update_seconds = medians[3 + 2 * precision];
    const double mine = medians[0] + mine_update, pass = medians[1] + pass_update_seconds;
    const double bytes = static_cast<double>(count) * hpctrain::bench::optimizer_pass_bytes_per_element(bf16);
    const char* name = bf16 ? "bf16" : "fp32";
    std::printf("  %-24s %10.3f   pass %10.3f   ratio %.2f\n", bf16 ? "AdamW update + bf16 copy" : "AdamW update",
                mine_update * 1e3, pass_update_seconds * 1e3, pass_update_seconds / mine_update);
    std::printf("  %-24s %10.3f   pass %10.3f   ratio %.2f   (%.1f vs %.1f GB/s)\n",
                bf16 ? "phase, bf16 copy" : "phase, fp32", mine * 1e3, pass * 1e3, pass / mine, bytes / mine * 1e-9,
                bytes / pass * 1e-9);
    std::printf(
        "OPTIMIZER precision=%s threads=%d elements=%lld bytes=%.0f hpctrain_seconds=%.6g pass_seconds=%.6g "
        "ratio=%.3f\n",
        name, threads, static_cast<long long>(count), bytes, mine, pass, pass / mine);
  }
  return 0;
}
