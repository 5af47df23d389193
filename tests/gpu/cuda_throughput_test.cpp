// Ceilings for tools/gpu-check.sh's throughput rows, measured on the device itself: the cuBLASLt rate of exactly the
// matrix products of one training step of an MLP (forward, weight and data gradients; bf16 inputs, fp32 weight
// gradients), and the device-to-device copy bandwidth that bounds the optimizer pass. Prints one line
//   CEILING gemm_tflops=... copy_gbs=... widths=... batch=...
// that the script reads. $HPCTRAIN_CEILING_WIDTHS (default 2,4096,4096,4096,3) and $HPCTRAIN_CEILING_BATCH (8192)
// give the MLP. A measurement, not a comparison: it fails only when the rates cannot be measured. Skips without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

std::vector<std::int64_t> widths_from_environment() {
  const char* text = std::getenv("HPCTRAIN_CEILING_WIDTHS");
  std::stringstream list(text != nullptr ? text : "2,4096,4096,4096,3");
  std::vector<std::int64_t> widths;
  for (std::string item; std::getline(list, item, ',');) widths.push_back(std::stoll(item));
  return widths;
}

// Seconds per call of `work`, after one warm-up call, over `repeats` calls (the backend synchronised around them).
template <class Work>
double seconds_per_call(Backend& backend, int repeats, Work&& work) {
  work();
  backend.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) work();
  backend.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
}

TEST(CudaCeilings, StepProductsAndCopyBandwidth) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  const std::vector<std::int64_t> widths = widths_from_environment();
  const char* batch_text = std::getenv("HPCTRAIN_CEILING_BATCH");
  const std::int64_t batch = batch_text != nullptr ? std::stoll(batch_text) : 8192;
  ASSERT_GE(widths.size(), 2u);

  double flops = 0.0, seconds = 0.0;
  for (std::size_t layer = 0; layer + 1 < widths.size(); ++layer) {
    const std::int64_t in = widths[layer], out = widths[layer + 1];
    test_support::TestTensor x(*gpu, DType::bf16, batch, in), w(*gpu, DType::bf16, out, in);
    test_support::TestTensor y(*gpu, DType::bf16, batch, out), dw(*gpu, DType::f32, out, in);
    test_support::TestTensor dx(*gpu, DType::bf16, batch, in);
    x.randomize(1);
    w.randomize(2);
    y.randomize(3);
    const double product = 2.0 * static_cast<double>(batch * in * out);
    // forward: y = x w^T; weight gradient: dw = dy^T x; data gradient (not for the first layer): dx = dy w
    seconds +=
        seconds_per_call(*gpu, 10, [&] { gpu->gemm(x.view(), false, w.view(), true, y.view(), nullptr, false); });
    seconds +=
        seconds_per_call(*gpu, 10, [&] { gpu->gemm(y.view(), true, x.view(), false, dw.view(), nullptr, false); });
    flops += 2 * product;
    if (layer > 0) {
      seconds +=
          seconds_per_call(*gpu, 10, [&] { gpu->gemm(y.view(), false, w.view(), false, dx.view(), nullptr, false); });
      flops += product;
    }
  }
  const std::size_t bytes = std::size_t{1} << 30;
  test_support::BackendBuffer from(*gpu, bytes), to(*gpu, bytes);
  gpu->zero(from.data(), bytes);
  const double copy = seconds_per_call(*gpu, 10, [&] { gpu->copy(to.data(), from.data(), bytes); });
  ASSERT_GT(seconds, 0.0);
  ASSERT_GT(copy, 0.0);
  std::string list;
  for (std::int64_t width : widths) list += (list.empty() ? "" : ",") + std::to_string(width);
  std::printf("CEILING gemm_tflops=%.1f copy_gbs=%.0f widths=%s batch=%lld\n", flops / seconds / 1e12,
              2.0 * static_cast<double>(bytes) / copy / 1e9, list.c_str(), static_cast<long long>(batch));
}

}  // namespace
}  // namespace hpctrain
