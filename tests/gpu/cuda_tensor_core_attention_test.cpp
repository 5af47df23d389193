// The tensor-core attention kernels (src/kernels/cuda/tensor_core_attention.cu, HPCTRAIN_CUDA_ATTENTION=tensor_core)
// against an f64 CPU reference and against the reference CUDA kernels (HPCTRAIN_CUDA_ATTENTION=reference): forward
// (out, lse) and the three input gradients (dQ, dK, dV checked apart), bf16 and fp16, causal and not, T in {1, 63,
// 64, 257, 1024} at head_dim 64 and T 257 at head_dim 32 and 128; random inputs, outputs poisoned with NaN (NaN never
// passes), relative-norm tolerances per storage dtype; the backward must give identical bits on two runs. Calls the
// kernels do not cover (fp32, head_dim 16) must still be right (they fall back to the reference kernels).
//
// Inputs are multiples of 1/64 (qkv in [-2, 2]) and 1/128 (dout in [-1, 1]): exact in bf16 and fp16 alike, so one f64
// reference serves both dtypes. Tolerances: a NumPy model of the kernels' roundings (P and dS rounded to 16 bits
// before their products, results stored in 16 bits) gives relative-norm errors of about 2.5e-3 (bf16) and 3e-4 (fp16)
// for these inputs, the reference kernels 1.7e-3 and 2.1e-4; the limits below leave a factor of 4 or more.
// Skips (77) without a GPU; HPCTRAIN_GPU_TEST_SELF_CHECK=1 runs the CPU backend in both places (checks the f64
// reference, the harness and the tolerances on any machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "cuda_test_support.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda/attention_plan.hpp"

namespace hpctrain {
namespace {

using test_support::attention_part;
using test_support::grid_values;
using test_support::reference_attention;
using test_support::ReferenceAttention;

double output_tolerance(DType dtype) { return tolerance(dtype); }  // 1e-2 bf16, 1e-3 fp16, 1e-5 fp32
double gradient_tolerance(DType dtype) { return 1.5 * tolerance(dtype); }
constexpr double lse_tolerance = 1e-5;  // fp32 in every storage dtype

// A backend of each attention kernel: the CUDA backend made with HPCTRAIN_CUDA_ATTENTION set (read at construction),
// or the CPU backend in the self-check.
class TensorCoreAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    if (self_check()) {
      tensor_core = make_cpu_backend();
      reference = make_cpu_backend();
      return;
    }
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const char* before = std::getenv(cuda::attention_kernel_variable);
    const std::string saved = before != nullptr ? before : "";
    setenv(cuda::attention_kernel_variable, "tensor_core", 1);
    tensor_core = make_cuda_backend(0);
    setenv(cuda::attention_kernel_variable, "reference", 1);
    reference = make_cuda_backend(0);
    if (before != nullptr)
      setenv(cuda::attention_kernel_variable, saved.c_str(), 1);
    else
      unsetenv(cuda::attention_kernel_variable);
  }
  static bool self_check() { return std::getenv("HPCTRAIN_GPU_TEST_SELF_CHECK") != nullptr; }

  // What one backend gives on one call: out, lse (from its forward) and dqkv (its backward on those), plus a second
  // backward's dqkv for the determinism check.
  struct Results {
    std::vector<double> out, dqkv, dqkv_again;
    std::vector<float> lse;
  };
  static Results run(Backend& backend, const AttentionGeometry& g, DType dtype, const std::vector<double>& qkv_values,
                     const std::vector<double>& dout_values) {
    const std::int64_t rows = g.batch * g.sequence;
    TestTensor qkv(backend, dtype, rows, 3 * g.width()), out(backend, dtype, rows, g.width());
    TestTensor dout(backend, dtype, rows, g.width()), dqkv(backend, dtype, rows, 3 * g.width());
    TestArray<float> lse(backend, std::vector<float>(static_cast<std::size_t>(g.batch * g.heads * g.sequence),
                                                     std::numeric_limits<float>::quiet_NaN()));
    qkv.set(qkv_values);
    dout.set(dout_values);
    out.poison();
    dqkv.poison();
    Results results;
    backend.attention_forward(g, qkv.view(), out.view(), lse.data());
    results.out = out.get();
    results.lse = lse.get();
    backend.attention_backward(g, qkv.view(), out.view(), dout.view(), lse.data(), dqkv.view());
    results.dqkv = dqkv.get();
    dqkv.poison();
    backend.attention_backward(g, qkv.view(), out.view(), dout.view(), lse.data(), dqkv.view());
    results.dqkv_again = dqkv.get();
    return results;
  }

  // Every result of `got` within the tolerances of `want` (f64 reference or the other kernel's results).
  static void expect_close(const Results& got, const std::vector<double>& want_out, const std::vector<double>& want_lse,
                           const std::vector<double>& want_dqkv, const AttentionGeometry& g, DType dtype,
                           const std::string& where) {
    const double out = relative_error(got.out, want_out);
    const double lse = relative_error(std::vector<double>(got.lse.begin(), got.lse.end()), want_lse);
    double gradients[3];
    for (int which = 0; which < 3; ++which)
      gradients[which] =
          relative_error(attention_part(got.dqkv, g.width(), which), attention_part(want_dqkv, g.width(), which));
    // The margins, for the log (tools/gpu-check.sh keeps it): relative-norm errors.
    std::printf("%s: out %.1e lse %.1e dQ %.1e dK %.1e dV %.1e\n", where.c_str(), out, lse, gradients[0], gradients[1],
                gradients[2]);
    EXPECT_LE(out, output_tolerance(dtype)) << "out, " << where;
    EXPECT_LE(lse, lse_tolerance) << "lse, " << where;
    const char* names[] = {"dQ", "dK", "dV"};
    for (int which = 0; which < 3; ++which)
      EXPECT_LE(gradients[which], gradient_tolerance(dtype)) << names[which] << ", " << where;
  }

  void compare(const std::vector<AttentionGeometry>& shapes);

  std::unique_ptr<Backend> tensor_core, reference;
};

// Every result of the tensor-core kernels against f64, their backward twice, and (head_dim <= 64) the reference
// kernels against f64 and against the tensor-core kernels.
void TensorCoreAttention::compare(const std::vector<AttentionGeometry>& shapes) {
  for (const AttentionGeometry& g : shapes) {
    const std::int64_t rows = g.batch * g.sequence;
    const auto qkv = grid_values(static_cast<std::size_t>(rows * 3 * g.width()), 11 + g.sequence, 2.0, 64.0);
    const auto dout = grid_values(static_cast<std::size_t>(rows * g.width()), 13 + g.head_dim, 1.0, 128.0);
    const ReferenceAttention want = reference_attention(g, qkv, dout);
    for (DType dtype : {DType::bf16, DType::f16}) {
      const std::string where = describe(g, dtype);
      const Results fast = run(*tensor_core, g, dtype, qkv, dout);
      expect_close(fast, want.out, want.lse, want.dqkv, g, dtype, "tensor-core kernel vs f64, " + where);
      EXPECT_EQ(fast.dqkv_again, fast.dqkv) << "tensor-core backward not reproducible, " << where;
      EXPECT_FALSE(has_nan(fast.dqkv_again)) << where;
      if (g.head_dim > 64) continue;  // beyond the reference kernel (NotSupported)
      const Results slow = run(*reference, g, dtype, qkv, dout);
      expect_close(slow, want.out, want.lse, want.dqkv, g, dtype, "reference kernel vs f64, " + where);
      expect_close(fast, slow.out, std::vector<double>(slow.lse.begin(), slow.lse.end()), slow.dqkv, g, dtype,
                   "tensor-core vs reference kernel, " + where);
      // The tensor-core kernels round P and dS to 16 bits before their products; the reference kernel does not. So
      // unless the selection quietly fell back, the two differ somewhere on a long sequence.
      if (!self_check() && g.sequence >= 257)
        EXPECT_NE(fast.dqkv, slow.dqkv) << "identical to the reference kernel: was the tensor-core kernel run? "
                                        << where;
    }
  }
}

// Short sequences (what compute-sanitizer's racecheck runs in tools/gpu-check.sh): every tile count up to 5, tails.
TEST_F(TensorCoreAttention, ShortSequencesAgainstF64AndTheReferenceKernel) {
  std::vector<AttentionGeometry> shapes;
  for (bool causal : {true, false}) {
    for (std::int64_t sequence : {1, 63, 64, 257}) shapes.push_back(make_attention(2, sequence, 2, 64, causal));
    shapes.push_back(make_attention(1, 257, 3, 32, causal));
    shapes.push_back(make_attention(1, 257, 2, 128, causal));
  }
  compare(shapes);
}

TEST_F(TensorCoreAttention, LongSequenceAgainstF64AndTheReferenceKernel) {
  compare({make_attention(1, 1024, 2, 64, true), make_attention(1, 1024, 2, 64, false)});
}

// What the tensor-core kernels do not cover runs the reference kernels: fp32 storage, head_dim 16.
TEST_F(TensorCoreAttention, UncoveredCallsFallBackToTheReferenceKernel) {
  struct Case {
    AttentionGeometry g;
    DType dtype;
  };
  for (const Case& c :
       {Case{make_attention(2, 70, 2, 64, true), DType::f32}, Case{make_attention(2, 70, 3, 16, false), DType::bf16}}) {
    const std::int64_t rows = c.g.batch * c.g.sequence;
    const auto qkv = grid_values(static_cast<std::size_t>(rows * 3 * c.g.width()), 17, 2.0, 64.0);
    const auto dout = grid_values(static_cast<std::size_t>(rows * c.g.width()), 19, 1.0, 128.0);
    const ReferenceAttention want = reference_attention(c.g, qkv, dout);
    const std::string where = describe(c.g, c.dtype);
    const Results fast = run(*tensor_core, c.g, c.dtype, qkv, dout);
    const double forward_limit = c.dtype == DType::f32 ? 2e-5 : output_tolerance(c.dtype);
    const double backward_limit = c.dtype == DType::f32 ? 1e-4 : gradient_tolerance(c.dtype);
    EXPECT_LE(relative_error(fast.out, want.out), forward_limit) << where;
    EXPECT_LE(relative_error(fast.dqkv, want.dqkv), backward_limit) << where;
    const Results slow = run(*reference, c.g, c.dtype, qkv, dout);
    EXPECT_EQ(fast.dqkv, slow.dqkv) << "the same (reference) kernel on both backends, " << where;
  }
}

}  // namespace
}  // namespace hpctrain
