// Tests of the CPU backend's matrix products: every transpose combination, with and without bias and accumulation, for
// f32/bf16/f16 inputs into f32/bf16/f16 outputs (and f64), against a double reference on the dequantised inputs;
// primitive caching; the empty reduction; and a finite-difference check in f64 of a linear layer's backward
// (dX = dY W, dW = dY^T X, db = column sums of dY) built from gemm and bias_gradient.
#include "../../src/kernels/cpu/cpu_gemm.hpp"  // the unit under test of the cache check (private to the backend)

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "../../src/kernels/cpu/cpu_common.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;

struct GemmShape {
  std::int64_t m, k, n;
};

// c = op(a) op(b) [+ bias] [+ c_old] in double. a stored (m, k) or (k, m) if transposed; b (k, n) or (n, k).
std::vector<double> reference_gemm(const std::vector<double>& a, bool transpose_a, const std::vector<double>& b,
                                   bool transpose_b, const GemmShape& s, const std::vector<double>& bias,
                                   const std::vector<double>& c_old) {
  std::vector<double> c(static_cast<std::size_t>(s.m * s.n));
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < s.n; ++j) {
      double sum = bias.empty() ? 0.0 : bias[j];
      for (std::int64_t p = 0; p < s.k; ++p)
        sum += (transpose_a ? a[p * s.m + i] : a[i * s.k + p]) * (transpose_b ? b[j * s.k + p] : b[p * s.n + j]);
      if (!c_old.empty()) sum += c_old[i * s.n + j];
      c[i * s.n + j] = sum;
    }
  return c;
}

// One product through the backend, compared with the reference. Returns the relative error.
double check_gemm(Backend& backend, DType input, DType output, const GemmShape& s, bool transpose_a, bool transpose_b,
                  bool with_bias, bool accumulate, std::uint64_t seed) {
  TestTensor a(backend, input, transpose_a ? s.k : s.m, transpose_a ? s.m : s.k);
  TestTensor b(backend, input, transpose_b ? s.n : s.k, transpose_b ? s.k : s.n);
  TestTensor c(backend, output, s.m, s.n);
  TestTensor bias(backend, master_of(input), 1, s.n);
  const auto a_values = a.randomize(seed);
  const auto b_values = b.randomize(seed + 1);
  const auto bias_values = with_bias ? bias.randomize(seed + 2) : std::vector<double>{};
  std::vector<double> c_old;
  if (accumulate) {
    c_old = c.randomize(seed + 3);
  } else {
    c.poison();
  }
  backend.gemm(a.view(), transpose_a, b.view(), transpose_b, c.view(), with_bias ? bias.data() : nullptr, accumulate);
  return relative_error(c.get(), reference_gemm(a_values, transpose_a, b_values, transpose_b, s, bias_values, c_old));
}

// Inputs are dequantised exactly, so the error is fp32 accumulation plus the rounding of the output.
double gemm_tolerance(DType input, DType output) {
  return input == DType::f64 && output == DType::f64 ? 1e-13 : std::max(tolerance(output), 1e-5);
}

TEST(CpuGemm, AllTransposesBiasAndAccumulateForEveryDtypePair) {
  auto backend = make_cpu_backend();
  const GemmShape shapes[] = {{7, 13, 5}, {33, 70, 19}};
  std::uint64_t seed = 100;
  for (const GemmShape& shape : shapes)
    for (DType input : {DType::f32, DType::bf16, DType::f16})
      for (DType output : {DType::f32, DType::bf16, DType::f16, DType::f64})
        for (int transposes = 0; transposes < 4; ++transposes)
          for (int options = 0; options < 4; ++options) {
            const bool transpose_a = transposes & 1, transpose_b = transposes & 2;
            const bool with_bias = options & 1, accumulate = options & 2;
            const double error =
                check_gemm(*backend, input, output, shape, transpose_a, transpose_b, with_bias, accumulate, seed += 10);
            EXPECT_LE(error, gemm_tolerance(input, output))
                << dtype_name(input) << " -> " << dtype_name(output) << " m,k,n " << shape.m << "," << shape.k << ","
                << shape.n << " ta " << transpose_a << " tb " << transpose_b << " bias " << with_bias << " accumulate "
                << accumulate;
          }
}

TEST(CpuGemm, DoublePrecisionLoops) {
  auto backend = make_cpu_backend();
  std::uint64_t seed = 7000;
  for (int transposes = 0; transposes < 4; ++transposes)
    for (int options = 0; options < 4; ++options) {
      const bool transpose_a = transposes & 1, transpose_b = transposes & 2;
      const double error = check_gemm(*backend, DType::f64, DType::f64, {6, 9, 4}, transpose_a, transpose_b,
                                      options & 1, options & 2, seed += 10);
      EXPECT_LE(error, 1e-14) << "ta " << transpose_a << " tb " << transpose_b << " options " << options;
    }
}

TEST(CpuGemm, LargerShapesUseTheOptimisedKernels) {
  auto backend = make_cpu_backend();
  const GemmShape shape{64, 256, 96};
  for (int transposes = 0; transposes < 4; ++transposes) {
    const bool transpose_a = transposes & 1, transpose_b = transposes & 2;
    EXPECT_LE(check_gemm(*backend, DType::bf16, DType::bf16, shape, transpose_a, transpose_b, true, false, 11),
              tolerance(DType::bf16));
    EXPECT_LE(check_gemm(*backend, DType::bf16, DType::f32, shape, transpose_a, transpose_b, true, true, 12), 1e-5);
    EXPECT_LE(check_gemm(*backend, DType::f32, DType::f32, shape, transpose_a, transpose_b, false, true, 13), 1e-5);
  }
}

TEST(CpuGemm, EmptyReductionGivesBias) {
  auto backend = make_cpu_backend();
  for (DType input : {DType::f32, DType::f64}) {
    TestTensor a(*backend, input, 3, 0), b(*backend, input, 0, 4), c(*backend, input, 3, 4);
    TestTensor bias(*backend, master_of(input), 1, 4);
    const auto bias_values = bias.randomize(5);
    c.poison();
    backend->gemm(a.view(), false, b.view(), false, c.view(), bias.data(), false);
    std::vector<double> want;
    for (int i = 0; i < 3; ++i) want.insert(want.end(), bias_values.begin(), bias_values.end());
    EXPECT_LE(relative_error(c.get(), want), 1e-7) << dtype_name(input);
  }
}

TEST(CpuGemm, MismatchedShapesOrInputDtypesAreRejected) {
  auto backend = make_cpu_backend();
  TestTensor a(*backend, DType::f32, 3, 4), b(*backend, DType::f32, 5, 2), c(*backend, DType::f32, 3, 2);
  EXPECT_THROW(backend->gemm(a.view(), false, b.view(), false, c.view(), nullptr, false), Error);
  TestTensor b16(*backend, DType::bf16, 4, 2);
  EXPECT_THROW(backend->gemm(a.view(), false, b16.view(), false, c.view(), nullptr, false), Error);
}

// A first operand stored transposed and large enough is copied row-major before the product (oneDNN runs that layout
// at about twice the rate): shapes off the copy's 32 x 32 tiles, against the double reference, and bit for bit the
// product of the same values given row-major (the copy changes the layout, not the arithmetic).
TEST(CpuGemm, TransposedFirstOperandCopiedRowMajor) {
  auto backend = make_cpu_backend();
  const GemmShape shape{150, 130, 70};  // m x k = 19,500 values: past the copy's threshold
  std::uint64_t seed = 900;
  for (DType input : {DType::f32, DType::bf16}) {
    for (bool accumulate : {false, true}) {
      TestTensor stored(*backend, input, shape.k, shape.m), row_major(*backend, input, shape.m, shape.k);
      TestTensor b(*backend, input, shape.k, shape.n), bias(*backend, DType::f32, 1, shape.n);
      TestTensor c(*backend, DType::f32, shape.m, shape.n), c_row_major(*backend, DType::f32, shape.m, shape.n);
      const auto a_values = stored.randomize(seed++);
      std::vector<double> transposed(a_values.size());
      for (std::int64_t p = 0; p < shape.k; ++p)
        for (std::int64_t i = 0; i < shape.m; ++i) transposed[i * shape.k + p] = a_values[p * shape.m + i];
      row_major.set(transposed);
      const auto b_values = b.randomize(seed++);
      const auto bias_values = bias.randomize(seed++);
      std::vector<double> c_old;
      if (accumulate) {
        c_old = c.randomize(seed++);
        c_row_major.set(c_old);
      } else {
        c.poison();
        c_row_major.poison();
      }
      backend->gemm(stored.view(), true, b.view(), false, c.view(), bias.data(), accumulate);
      backend->gemm(row_major.view(), false, b.view(), false, c_row_major.view(), bias.data(), accumulate);
      EXPECT_LE(relative_error(c.get(), reference_gemm(a_values, true, b_values, false, shape, bias_values, c_old)),
                1e-5)
          << dtype_name(input) << " accumulate " << accumulate;
      EXPECT_EQ(c.get(), c_row_major.get()) << dtype_name(input) << " accumulate " << accumulate;
    }
  }
}

// On CPUs without AVX-512 a non-transposed fp32 second operand on a 32-byte boundary is staged 16 bytes past it for
// oneDNN's AVX2 sgemm (cpu_gemm.cpp, avx2_sgemm_b_offset). The staged product must equal, bit for bit, the product of
// the same values that start 16 bytes past the boundary already (which is never staged), and the reference; 16-bit
// inputs are widened into the offset buffer directly. Elsewhere both calls run unstaged and must agree too.
TEST(CpuGemm, SecondOperandOffTheBoundaryGivesTheSameBits) {
  auto backend = make_cpu_backend();
  const GemmShape shape{64, 300, 260};  // m >= 32 and k x n = 78,000 values: past the staging threshold
  std::uint64_t seed = 1200;
  for (DType input : {DType::f32, DType::bf16}) {
    for (bool accumulate : {false, true}) {
      TestTensor a(*backend, input, shape.m, shape.k), b(*backend, input, shape.k, shape.n);
      TestTensor b_shifted_storage(*backend, input, 1, shape.k * shape.n + 32);  // the same values 16 bytes in
      TestTensor c(*backend, DType::f32, shape.m, shape.n), c_shifted(*backend, DType::f32, shape.m, shape.n);
      const auto a_values = a.randomize(seed++);
      const auto b_values = b.randomize(seed++);
      std::vector<double> shifted(b_shifted_storage.size(), 0.0);
      const std::size_t shift = 16 / dtype_size(input);
      std::copy(b_values.begin(), b_values.end(), shifted.begin() + static_cast<std::ptrdiff_t>(shift));
      b_shifted_storage.set(shifted);
      const TensorView b_shifted{static_cast<char*>(b_shifted_storage.data()) + 16, input, shape.k, shape.n};
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 32, 0u) << "the test needs b on a 32-byte boundary";
      std::vector<double> c_old;
      if (accumulate) {
        c_old = c.randomize(seed++);
        c_shifted.set(c_old);
      } else {
        c.poison();
        c_shifted.poison();
      }
      backend->gemm(a.view(), false, b.view(), false, c.view(), nullptr, accumulate);
      backend->gemm(a.view(), false, b_shifted, false, c_shifted.view(), nullptr, accumulate);
      EXPECT_LE(relative_error(c.get(), reference_gemm(a_values, false, b_values, false, shape, {}, c_old)),
                gemm_tolerance(input, DType::f32))
          << dtype_name(input) << " accumulate " << accumulate;
      EXPECT_EQ(c.get(), c_shifted.get()) << dtype_name(input) << " accumulate " << accumulate;
    }
  }
}

TEST(CpuGemm, PrimitivesAreCreatedOncePerConfiguration) {
  auto backend = make_cpu_backend();
  cpu::CpuGemm gemm;
  TestTensor a(*backend, DType::bf16, 16, 32), b(*backend, DType::bf16, 24, 32), c(*backend, DType::bf16, 16, 24);
  TestTensor bias(*backend, DType::f32, 1, 24);
  a.randomize(1);
  b.randomize(2);
  bias.randomize(3);
  gemm.run(a.view(), false, b.view(), true, c.view(), bias.data(), false);
  const auto first = c.get();
  EXPECT_EQ(gemm.cached_primitives(), 1u);
  for (int repeat = 0; repeat < 3; ++repeat) {
    c.poison();
    gemm.run(a.view(), false, b.view(), true, c.view(), bias.data(), false);
    EXPECT_EQ(c.get(), first) << "a cached primitive gives the same bits";
  }
  EXPECT_EQ(gemm.cached_primitives(), 1u);
  // Accumulate: another configuration where oneDNN runs bf16 (a sum post-op); widened bf16 (no bf16 kernel on this
  // CPU) accumulates while rounding into c, with the same fp32 primitive.
  const bool native = cpu::onednn_runs_bf16();
  gemm.run(a.view(), false, b.view(), true, c.view(), bias.data(), true);
  gemm.run(a.view(), false, b.view(), true, c.view(), nullptr, false);  // no bias: another
  EXPECT_EQ(gemm.cached_primitives(), native ? 3u : 2u);
  // f16 inputs run the f32 primitive of the same shape (the one widened bf16 already made)
  TestTensor a16(*backend, DType::f16, 16, 32), b16(*backend, DType::f16, 24, 32), c32(*backend, DType::f32, 16, 24);
  a16.randomize(4);
  b16.randomize(5);
  gemm.run(a16.view(), false, b16.view(), true, c32.view(), nullptr, false);
  gemm.run(a16.view(), false, b16.view(), true, c32.view(), nullptr, false);
  EXPECT_EQ(gemm.cached_primitives(), native ? 4u : 2u);
}

// Linear layer y = x W^T + b, objective L = sum(y * r): dL/dy = r, and the backward products must be the derivatives.
TEST(CpuGemm, LinearBackwardMatchesFiniteDifferencesInDouble) {
  auto backend = make_cpu_backend();
  const std::int64_t batch = 3, in = 4, out = 5;
  TestTensor x(*backend, DType::f64, batch, in), w(*backend, DType::f64, out, in), y(*backend, DType::f64, batch, out);
  TestTensor b(*backend, DType::f64, 1, out), r(*backend, DType::f64, batch, out);
  auto x_values = random_values(batch * in, 21);
  auto w_values = random_values(out * in, 22);
  auto b_values = random_values(out, 23);
  const auto r_values = r.randomize(24);

  const auto objective = [&]() {
    x.set(x_values);
    w.set(w_values);
    b.set(b_values);
    y.poison();
    backend->gemm(x.view(), false, w.view(), true, y.view(), b.data(), false);
    return dot(y.get(), r_values);
  };
  const double step = 1e-5;
  const auto numeric_dx = central_differences(x_values, step, objective);
  const auto numeric_dw = central_differences(w_values, step, objective);
  const auto numeric_db = central_differences(b_values, step, objective);

  x.set(x_values);
  w.set(w_values);
  TestTensor dx(*backend, DType::f64, batch, in), dw(*backend, DType::f64, out, in), db(*backend, DType::f64, 1, out);
  dx.poison();
  dw.poison();
  db.poison();
  backend->gemm(r.view(), false, w.view(), false, dx.view(), nullptr, false);  // dX = dY W: (batch, in)
  backend->gemm(r.view(), true, x.view(), false, dw.view(), nullptr, false);   // dW = dY^T X: (out, in)
  backend->bias_gradient(r.view(), db.data(), DType::f64, false);              // db = sum over rows of dY
  EXPECT_LE(relative_error(dx.get(), numeric_dx), 1e-8);
  EXPECT_LE(relative_error(dw.get(), numeric_dw), 1e-8);
  EXPECT_LE(relative_error(db.get(), numeric_db), 1e-8);

  // gradient accumulation adds a second backward onto the first
  backend->gemm(r.view(), true, x.view(), false, dw.view(), nullptr, true);
  backend->bias_gradient(r.view(), db.data(), DType::f64, true);
  auto twice = numeric_dw;
  for (double& value : twice) value *= 2;
  EXPECT_LE(relative_error(dw.get(), twice), 1e-8);
  twice = numeric_db;
  for (double& value : twice) value *= 2;
  EXPECT_LE(relative_error(db.get(), twice), 1e-8);
}

// Not a test: timings of bf16 against fp32 products (run with --gtest_also_run_disabled_tests in a Release build).
TEST(CpuGemm, DISABLED_Benchmark) {
  auto backend = make_cpu_backend();
  for (const GemmShape s : {GemmShape{256, 1024, 1024}, GemmShape{1024, 1024, 1024}}) {
    for (DType input : {DType::f32, DType::bf16, DType::f16}) {
      for (int transposes : {0, 2, 1}) {  // forward (x W^T), dX (dY W), dW (dY^T X)
        const bool ta = transposes & 1, tb = transposes & 2;
        TestTensor a(*backend, input, ta ? s.k : s.m, ta ? s.m : s.k);
        TestTensor b(*backend, input, tb ? s.n : s.k, tb ? s.k : s.n);
        TestTensor c(*backend, input == DType::f16 ? DType::f16 : input, s.m, s.n);
        a.randomize(1);
        b.randomize(2);
        backend->gemm(a.view(), ta, b.view(), tb, c.view(), nullptr, false);
        const int repeats = 20;
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < repeats; ++i) backend->gemm(a.view(), ta, b.view(), tb, c.view(), nullptr, false);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("%5s m,k,n %5lld %5lld %5lld ta %d tb %d: %8.1f GFLOP/s\n", dtype_name(input),
                    static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(s.n), ta, tb,
                    2.0 * s.m * s.n * s.k * repeats / seconds * 1e-9);
      }
    }
  }
}

}  // namespace
}  // namespace hpctrain
