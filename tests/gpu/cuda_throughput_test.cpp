// Ceilings for tools/gpu-check.sh's throughput rows, measured on the device itself: the cuBLASLt rate of exactly the
// matrix products of one training step of an MLP (forward, weight and data gradients; bf16 inputs, fp32 weight
// gradients), and the device-to-device copy bandwidth that bounds the optimizer pass. Prints one line
//   CEILING gemm_tflops=... copy_gbs=... widths=... batch=...
// that the script reads. $HPCTRAIN_CEILING_WIDTHS (default 2,4096,4096,4096,3) and $HPCTRAIN_CEILING_BATCH (8192)
// give the MLP. A measurement, not a comparison: it fails only when the rates cannot be measured. Skips without a GPU.
// Also the fused attention's time per call (forward, forward + backward) with the tensor-core and the reference kernels
// side by side (HPCTRAIN_CUDA_ATTENTION), medians of 5 windows: one line
//   ATTENTION batch=16 heads=12 head_dim=64 sequence=1024 ... tensor_core_forward_ms=... reference_forward_ms=...
// for tools/gpu-check.sh's timing row (bench/sdpa_cuda.py times PyTorch's scaled_dot_product_attention beside it).
#include <gtest/gtest.h>

#include <algorithm>
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

// Median over 5 windows of 5 calls of the seconds per call (one warm-up call first).
template <class Work>
double median_seconds_per_call(Backend& backend, Work&& work) {
  std::vector<double> windows;
  work();
  for (int window = 0; window < 5; ++window) windows.push_back(seconds_per_call(backend, 5, work));
  std::sort(windows.begin(), windows.end());
  return windows[2];
}

TEST(CudaAttentionTiming, TensorCoreAndReferenceKernels) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const AttentionGeometry g{16, 1024, 12, 64, true, 0.125f};
  const std::int64_t rows = g.batch * g.sequence;
  std::string line = "ATTENTION batch=16 heads=12 head_dim=64 sequence=1024 dtype=bf16 causal=1";
  const char* before = std::getenv("HPCTRAIN_CUDA_ATTENTION");
  const std::string saved = before != nullptr ? before : "";
  for (const char* kernel : {"tensor_core", "reference"}) {
    setenv("HPCTRAIN_CUDA_ATTENTION", kernel, 1);
    auto gpu = make_cuda_backend(0);
    test_support::TestTensor qkv(*gpu, DType::bf16, rows, 3 * g.width()), out(*gpu, DType::bf16, rows, g.width());
    test_support::TestTensor dout(*gpu, DType::bf16, rows, g.width()), dqkv(*gpu, DType::bf16, rows, 3 * g.width());
    test_support::TestArray<float> lse(*gpu, static_cast<std::size_t>(g.batch * g.heads * g.sequence));
    qkv.randomize(1, -2.0, 2.0);
    dout.randomize(2);
    const double forward =
        median_seconds_per_call(*gpu, [&] { gpu->attention_forward(g, qkv.view(), out.view(), lse.data()); });
    const double both = median_seconds_per_call(*gpu, [&] {
      gpu->attention_forward(g, qkv.view(), out.view(), lse.data());
      gpu->attention_backward(g, qkv.view(), out.view(), dout.view(), lse.data(), dqkv.view());
    });
    ASSERT_GT(forward, 0.0);
    ASSERT_GT(both, 0.0);
    char text[160];
    std::snprintf(text, sizeof text, " %s_forward_ms=%.3f %s_forward_backward_ms=%.3f", kernel, forward * 1e3, kernel,
                  both * 1e3);
    line += text;
  }
  if (before != nullptr)
    setenv("HPCTRAIN_CUDA_ATTENTION", saved.c_str(), 1);
  else
    unsetenv("HPCTRAIN_CUDA_ATTENTION");
  std::printf("%s\n", line.c_str());
}

}  // namespace
}  // namespace hpctrain
