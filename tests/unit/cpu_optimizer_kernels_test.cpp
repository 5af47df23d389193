// Tests of the CPU backend's optimizer kernels (the others: cpu_kernels_test.cpp): gradient statistics (norm,
// non-finite detection, clipping, determinism across thread counts); the fused optimizer step against references over
// several steps, and in pieces against whole (the sharded optimizer's split, with the norm's chunk statistics); the
// loss scaler through finish_step.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "../../src/kernels/cpu/cpu_gradient_norm.hpp"  // the unit under test of the path check (private to the backend)
#include "hpctrain/kernels/backend.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;

class CpuKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend();
};

// ---- gradient statistics ----

StepScalars statistics_of(Backend& backend, const std::vector<float>& gradients, float loss_scale,
                          float max_grad_norm) {
  TestArray<float> buffer(backend, gradients);
  StepScalars initial;
  initial.loss_scale = loss_scale;
  initial.grad_norm = std::nanf("");
  initial.clip_coefficient = std::nanf("");
  TestArray<StepScalars> scalars(backend, std::vector<StepScalars>{initial});
  OptimizerHyper hyper;
  hyper.max_grad_norm = max_grad_norm;
  backend.gradient_statistics(buffer.data(), static_cast<std::int64_t>(gradients.size()), hyper, scalars.data());
  return scalars.get()[0];
}

TEST_F(CpuKernels, GradientStatisticsNormClipAndNonFinite) {
  const float loss_scale = 1024.0f;
  const auto values = random_values(3 * 4096 + 123, 161);
  std::vector<float> gradients;
  double sum = 0.0;
  for (double value : values) {
    gradients.push_back(static_cast<float>(value * loss_scale));
    sum += static_cast<double>(gradients.back()) * gradients.back();
  }
  const double norm = std::sqrt(sum) / loss_scale;

  StepScalars s = statistics_of(*backend, gradients, loss_scale, 0.0f);
  EXPECT_EQ(s.found_nonfinite, 0);
  EXPECT_NEAR(s.grad_norm, norm, 1e-6 * norm);
  EXPECT_EQ(s.clip_coefficient, 1.0f) << "no clipping without max_grad_norm";

  s = statistics_of(*backend, gradients, loss_scale, static_cast<float>(norm / 4));
  EXPECT_NEAR(s.clip_coefficient, (norm / 4) / (norm + 1e-6), 1e-6);
  s = statistics_of(*backend, gradients, loss_scale, static_cast<float>(norm * 2));
  EXPECT_EQ(s.clip_coefficient, 1.0f);

  for (const float bad :
       {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    for (const std::size_t position : {std::size_t{0}, std::size_t{5000}, gradients.size() - 1}) {
      auto broken = gradients;
      broken[position] = bad;
      s = statistics_of(*backend, broken, loss_scale, 1.0f);
      EXPECT_EQ(s.found_nonfinite, 1) << bad << " at " << position;
      EXPECT_EQ(s.clip_coefficient, 1.0f);
    }
  s = statistics_of(*backend, {}, 1.0f, 1.0f);
  EXPECT_EQ(s.found_nonfinite, 0);
  EXPECT_EQ(s.grad_norm, 0.0f);
}

TEST_F(CpuKernels, GradientStatisticsDoNotDependOnTheThreadCount) {
#if defined(__SANITIZE_THREAD__)
  // Several OpenMP threads: libgomp is not built with ThreadSanitizer, whose reports on its barriers are false
  // (tools/sanitizers/README.md).
  GTEST_SKIP() << "OpenMP threads under ThreadSanitizer";
#endif
  std::vector<float> gradients;
  for (double value : random_values((std::size_t{1} << 20) + 77, 171, -1e3, 1e3))
    gradients.push_back(static_cast<float>(value));
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(1);
  const float one = statistics_of(*backend, gradients, 8.0f, 0.0f).grad_norm;
  omp_set_num_threads(2);
  const float two = statistics_of(*backend, gradients, 8.0f, 0.0f).grad_norm;
  omp_set_num_threads(3);
  const float three = statistics_of(*backend, gradients, 8.0f, 0.0f).grad_norm;
  omp_set_num_threads(threads_before);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, three);
}

// The norm's inner sums are fp32 blocks (cpu_backend.cpp): within 1e-6 of an fp64 reference (the stated bound is
// 9 u + the final rounding, u = 2^-24) on random gradients of every magnitude, including blocks whose squares would
// flush to zero or overflow in fp32 (summed again in fp64 there).
TEST_F(CpuKernels, GradientNormWithinItsBoundOfAnFp64ReferenceAtEveryMagnitude) {
  std::mt19937 generator(1234);
  std::uniform_real_distribution<double> exponent(-35.0, 25.0), unit(-1.0, 1.0);
  const std::size_t count = 5 * 4096 + 1000 + 37;  // whole chunks, whole blocks, a partial block
  const auto check = [&](const std::vector<float>& gradients, const char* what) {
    long double sum = 0.0L;
    for (const float g : gradients) sum += static_cast<long double>(g) * g;
    const double reference = static_cast<double>(std::sqrt(sum) / 4.0L);
    const StepScalars s = statistics_of(*backend, gradients, 4.0f, 0.0f);
    EXPECT_EQ(s.found_nonfinite, 0) << what;
    EXPECT_GT(reference, 0.0) << what;
    EXPECT_LE(std::abs(s.grad_norm - reference), 1e-6 * reference)
        << what << ": " << s.grad_norm << " vs " << reference;
  };
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> mixed(count), tiny(count), huge(count), scaled(count);
    const double scale = std::pow(10.0, exponent(generator));
    for (std::size_t i = 0; i < count; ++i) {
      mixed[i] = static_cast<float>(unit(generator) * std::pow(10.0, exponent(generator)));
      tiny[i] = static_cast<float>(unit(generator) * 1e-25);    // squares below fp32's normal range
      huge[i] = static_cast<float>(unit(generator) * 1e25);     // squares above fp32's range
      scaled[i] = static_cast<float>(unit(generator) * scale);  // one magnitude per trial
    }
    check(mixed, "mixed magnitudes");
    check(tiny, "tiny");
    check(huge, "huge");
    check(scaled, "one magnitude");
  }
}

// Blocks of +-0 gradients (dead ReLU units) add exactly 0 and skip the fp64 re-sum that blocks which may have
// flushed or overflowed in fp32 need; the result is bit for bit the sum without them, and a block with anything but
// +-0 (a subnormal, a square that flushes, an overflow, NaN, Inf) still takes the fp64 path.
TEST_F(CpuKernels, GradientNormSkipsZeroBlocksExactly) {
  constexpr std::size_t block = 256;  // cpu_backend.cpp's statistics_block
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::mt19937 generator(99);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const auto zeros = [&] {  // +0 and -0 at random
    std::vector<float> values(block);
    for (float& value : values) value = unit(generator) < 0.0f ? -0.0f : 0.0f;
    return values;
  };
  const auto normal = [&](float scale) {
    std::vector<float> values(block);
    for (float& value : values) value = unit(generator) * scale;
    return values;
  };
  const auto with = [&](std::vector<float> values, float odd) {  // +-0 but one element
    values[block / 3] = odd;
    return values;
  };
  const auto chunk_of = [](const std::vector<std::vector<float>>& blocks) {
    std::vector<float> values;
    for (const auto& b : blocks) values.insert(values.end(), b.begin(), b.end());
    return values;
  };
  const auto sum_of = [](const std::vector<float>& values, int& nonfinite, cpu::NormBlockPaths& paths) {
    paths = {};
    return cpu::chunk_sum_of_squares(values.data(), 0, static_cast<std::int64_t>(values.size()), nonfinite, &paths);
  };
  const auto a = normal(1.0f), b = normal(1e-3f), c = normal(1e20f), d = normal(1e-22f);
  int nonfinite = -1;
  cpu::NormBlockPaths paths;
  const double without = sum_of(chunk_of({a, b, c, d}), nonfinite, paths);
  EXPECT_EQ(nonfinite, 0);
  EXPECT_EQ(paths.fp32, 2);
  EXPECT_EQ(paths.fp64, 2) << "1e20 overflows and 1e-22 flushes in fp32";
  EXPECT_EQ(paths.zero, 0);

  const auto z = zeros();
  const double with_zeros = sum_of(chunk_of({z, a, zeros(), b, zeros(), c, z, d, zeros()}), nonfinite, paths);
  EXPECT_EQ(nonfinite, 0);
  EXPECT_EQ(with_zeros, without) << "zero blocks add exactly 0";
  EXPECT_EQ(paths.zero, 5);
  EXPECT_EQ(paths.fp32, 2);
  EXPECT_EQ(paths.fp64, 2);

  // +-0 blocks with one odd element: each takes the fp64 path and is summed exactly as an fp64 square would be.
  const float subnormal = 0x1p-140f, flushes = 1e-30f;
  for (const float odd : {subnormal, -subnormal, flushes, -flushes}) {
    const double sum = sum_of(chunk_of({z, with(zeros(), odd), z}), nonfinite, paths);
    EXPECT_EQ(nonfinite, 0) << odd;
    EXPECT_EQ(paths.fp64, 1) << odd;
    EXPECT_EQ(paths.zero, 2) << odd;
    // The FPU may read a subnormal input as zero (DAZ, set on the backend's threads): either is the fp64 path's.
    const double square = static_cast<double>(odd) * static_cast<double>(odd);
    EXPECT_TRUE(sum == square || ((odd == subnormal || odd == -subnormal) && sum == 0.0)) << odd << ": " << sum;
  }
  for (const float odd : {nan, inf, -inf}) {
    const double sum = sum_of(chunk_of({z, with(zeros(), odd), a, z}), nonfinite, paths);
    EXPECT_EQ(nonfinite, 1) << odd;
    EXPECT_EQ(paths.fp64, 1) << odd;
    EXPECT_EQ(paths.zero, 2) << odd;
    if (std::isnan(odd)) {
      EXPECT_TRUE(std::isnan(sum));
    } else {
      EXPECT_EQ(sum, inf) << odd;
    }
  }

  // Through the backend: a buffer of zero chunks and blocks around one chunk's values has that chunk's norm bit for
  // bit, and an all-zero buffer the norm +0 (no clipping).
  std::vector<float> sparse = chunk_of({zeros(), zeros(), a, zeros(), b, zeros(), zeros(), zeros()});
  std::vector<float> dense = chunk_of({a, b});
  sparse.insert(sparse.begin(), cpu::statistics_chunk, -0.0f);
  sparse.insert(sparse.end(), 3 * cpu::statistics_chunk + 17, 0.0f);
  const StepScalars s_sparse = statistics_of(*backend, sparse, 2.0f, 1.0f),
                    s_dense = statistics_of(*backend, dense, 2.0f, 1.0f);
  EXPECT_EQ(s_sparse.found_nonfinite, 0);
  EXPECT_EQ(s_sparse.grad_norm, s_dense.grad_norm);
  EXPECT_EQ(s_sparse.clip_coefficient, s_dense.clip_coefficient);
  const StepScalars s_zero = statistics_of(*backend, std::vector<float>(5 * cpu::statistics_chunk, -0.0f), 2.0f, 1.0f);
  EXPECT_EQ(s_zero.found_nonfinite, 0);
  EXPECT_EQ(s_zero.grad_norm, 0.0f);
  EXPECT_FALSE(std::signbit(s_zero.grad_norm));
  EXPECT_EQ(s_zero.clip_coefficient, 1.0f);
}

// A sharded update (each rank the chunks it owns): the partials of any split into whole chunks, summed over the
// "ranks", give gradient_statistics' bits, with a NaN and without; a range that cuts a chunk is refused.
TEST_F(CpuKernels, ChunkStatisticsOfAnySplitIntoWholeChunksGiveTheWholeBuffersBits) {
  const std::int64_t chunk = Backend::gradient_statistics_chunk, chunks = 8, count = 7 * chunk + 123;
  const float loss_scale = 64.0f;
  std::vector<float> gradients;
  for (double value : random_values(static_cast<std::size_t>(count), 401))
    gradients.push_back(static_cast<float>(value * loss_scale));
  const ElementRange first[] = {{0, 2 * chunk}, {4 * chunk, 7 * chunk}}, second[] = {{2 * chunk, 4 * chunk}},
                     third[] = {{7 * chunk, count}};  // the last chunk is partial
  OptimizerHyper hyper;
  hyper.max_grad_norm = 1.0f;
  for (const bool broken : {false, true}) {
    SCOPED_TRACE(broken ? "a NaN in chunk 5" : "finite");
    if (broken) gradients[5 * chunk + 9] = std::nanf("");
    const StepScalars whole = statistics_of(*backend, gradients, loss_scale, hyper.max_grad_norm);
    TestArray<float> buffer(*backend, gradients);
    std::vector<double> sum(2 * chunks, 0.0);
    for (const std::span<const ElementRange> owned :
         {std::span<const ElementRange>(first), std::span<const ElementRange>(second),
          std::span<const ElementRange>(third)}) {
      std::vector<double> partials(2 * chunks, 0.0);
      backend->gradient_chunk_statistics(buffer.data(), count, owned, partials.data());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += partials[i];
    }
    StepScalars initial;
    initial.loss_scale = loss_scale;
    TestArray<StepScalars> scalars(*backend, std::vector<StepScalars>{initial});
    backend->statistics_from_chunks(sum.data(), chunks, hyper, scalars.data());
    const StepScalars sharded = scalars.get()[0];
    EXPECT_EQ(sharded.found_nonfinite, broken ? 1 : 0);
    EXPECT_EQ(sharded.found_nonfinite, whole.found_nonfinite);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(sharded.grad_norm), std::bit_cast<std::uint32_t>(whole.grad_norm))
        << sharded.grad_norm << " vs " << whole.grad_norm;
    EXPECT_EQ(sharded.clip_coefficient, whole.clip_coefficient);
    if (!broken) EXPECT_LT(whole.clip_coefficient, 1.0f) << "the test should exercise clipping";
  }
  TestArray<float> buffer(*backend, gradients);
  std::vector<double> partials(2 * chunks, 0.0);
  const ElementRange cut[] = {{100, chunk}};
  EXPECT_ANY_THROW(backend->gradient_chunk_statistics(buffer.data(), count, cut, partials.data()));
}

// ---- optimizer ----

struct ParameterState {
  std::vector<double> parameters, state1, state2;
};

// PyTorch AdamW / SGD written out in double for a whole buffer; gradients already unscaled and clipped.
void reference_update(const OptimizerHyper& h, bool decay, double lr, int applied_steps,
                      const std::vector<double>& gradients, ParameterState& s) {
  const double wd = decay ? h.weight_decay : 0.0;
  const int t = applied_steps + 1;
  for (std::size_t i = 0; i < gradients.size(); ++i) {
    double& p = s.parameters[i];
    double g = gradients[i];
    if (h.type == OptimizerType::adamw) {
      p -= lr * wd * p;
      s.state1[i] = h.beta1 * s.state1[i] + (1 - static_cast<double>(h.beta1)) * g;
      s.state2[i] = h.beta2 * s.state2[i] + (1 - static_cast<double>(h.beta2)) * g * g;
      const double m_hat = s.state1[i] / (1 - std::pow(static_cast<double>(h.beta1), t));
      const double v_hat = s.state2[i] / (1 - std::pow(static_cast<double>(h.beta2), t));
      p -= lr * m_hat / (std::sqrt(v_hat) + h.eps);
    } else {
      g += wd * p;
      if (h.momentum != 0.0f) {
        s.state1[i] = applied_steps == 0 ? g : h.momentum * s.state1[i] + g;
        g = h.nesterov ? g + h.momentum * s.state1[i] : s.state1[i];
      }
      p -= lr * g;
    }
  }
}

std::vector<double> as_double(const std::vector<float>& values) { return {values.begin(), values.end()}; }

// Runs `steps` optimizer steps through the backend (gradient_statistics, optimizer_step, finish_step), one of them
// non-finite, and follows them with the reference.
void check_optimizer(Backend& backend, const OptimizerHyper& hyper, bool decay, DType working_dtype) {
  const std::size_t count = 1000;
  const float loss_scale = 512.0f;
  std::vector<float> initial;
  for (double value : random_values(count, 181)) initial.push_back(static_cast<float>(value));
  TestArray<float> parameters(backend, initial);
  TestArray<float> gradients(backend, count);
  // SGD's momentum buffer starts as the first gradient whatever the buffer holds: start it with junk to check that
  std::vector<float> state1_initial(count, hyper.type == OptimizerType::sgd ? 123.0f : 0.0f);
  TestArray<float> state1(backend, state1_initial);
  TestArray<float> state2(backend, std::vector<float>(count, 0.0f));
  const bool sgd_without_momentum = hyper.type == OptimizerType::sgd && hyper.momentum == 0.0f;
  TestTensor working(backend, working_dtype, 1, static_cast<std::int64_t>(count));
  working.poison();
  StepScalars start;
  start.loss_scale = loss_scale;
  TestArray<StepScalars> scalars(backend, std::vector<StepScalars>{start});
  LossScalerConfig scaler;  // disabled: the scale stays fixed

  ParameterState want{as_double(initial), as_double(state1_initial), std::vector<double>(count, 0.0)};
  int applied = 0;
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    std::vector<float> scaled;
    for (double value : random_values(count, 190 + step)) scaled.push_back(static_cast<float>(value * loss_scale));
    const bool skip = step == 3;
    if (skip) scaled[17] = std::numeric_limits<float>::infinity();
    gradients.set(scaled);
    auto s = scalars.get()[0];
    s.learning_rate = 0.01f * (step + 1);  // a schedule changes it every step
    scalars.set({s});
    const auto working_before = working.get();
    backend.gradient_statistics(gradients.data(), static_cast<std::int64_t>(count), hyper, scalars.data());
    backend.optimizer_step(hyper, decay, parameters.data(), gradients.data(),
                           sgd_without_momentum ? nullptr : state1.data(),
                           hyper.type == OptimizerType::adamw ? state2.data() : nullptr,
                           static_cast<std::int64_t>(count), working.view(), scalars.data());
    s = scalars.get()[0];
    EXPECT_EQ(s.found_nonfinite, skip ? 1 : 0);
    if (skip) {
      EXPECT_EQ(working.get(), working_before) << "a skipped step must not write the working copy";
    } else {
      if (hyper.max_grad_norm > 0.0f) {
        EXPECT_LT(s.clip_coefficient, 1.0f) << "the test should exercise clipping";
      }
      std::vector<double> unscaled;
      for (float g : scaled) unscaled.push_back(static_cast<double>(g) / loss_scale * s.clip_coefficient);
      reference_update(hyper, decay, s.learning_rate, s.applied_steps, unscaled, want);
      ++applied;
    }
    // (a skipped step leaves everything as the reference left it)
    const auto got = as_double(parameters.get());
    EXPECT_LE(relative_error(got, want.parameters), 1e-6);
    if (!sgd_without_momentum) {
      EXPECT_LE(relative_error(as_double(state1.get()), want.state1), 1e-6);
    }
    if (hyper.type == OptimizerType::adamw) {
      EXPECT_LE(relative_error(as_double(state2.get()), want.state2), 1e-6);
    }
    EXPECT_EQ(working.get(), quantized(working_dtype, got)) << "working copy is the rounded parameters";
    backend.finish_step(scaler, scalars.data());
    EXPECT_EQ(scalars.get()[0].applied_steps, applied);
  }
}

TEST_F(CpuKernels, AdamWStepMatchesReference) {
  OptimizerHyper hyper;
  hyper.type = OptimizerType::adamw;
  hyper.beta2 = 0.95f;
  hyper.weight_decay = 0.1f;
  hyper.max_grad_norm = 5.0f;  // the gradients' norm is about 18: clipped
  for (DType working : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(working));
    check_optimizer(*backend, hyper, true, working);
  }
  check_optimizer(*backend, hyper, false, DType::bf16);  // no weight decay on this range
}

TEST_F(CpuKernels, SgdStepMatchesReference) {
  OptimizerHyper hyper;
  hyper.type = OptimizerType::sgd;
  hyper.weight_decay = 0.01f;
  for (const float momentum : {0.0f, 0.9f})
    for (const bool nesterov : {false, true}) {
      if (momentum == 0.0f && nesterov) continue;
      SCOPED_TRACE(::testing::Message() << "momentum " << momentum << " nesterov " << nesterov);
      hyper.momentum = momentum;
      hyper.nesterov = nesterov;
      hyper.max_grad_norm = nesterov ? 5.0f : 0.0f;
      check_optimizer(*backend, hyper, true, DType::bf16);
      check_optimizer(*backend, hyper, false, DType::f32);
    }
}

TEST_F(CpuKernels, OptimizerWithoutWorkingCopy) {
  OptimizerHyper hyper;
  TestArray<float> parameters(*backend, std::vector<float>{1.0f, -1.0f});
  TestArray<float> gradients(*backend, std::vector<float>{2.0f, -2.0f});
  TestArray<float> m(*backend, std::vector<float>{0.0f, 0.0f}), v(*backend, std::vector<float>{0.0f, 0.0f});
  StepScalars s;
  s.learning_rate = 0.1f;
  TestArray<StepScalars> scalars(*backend, std::vector<StepScalars>{s});
  backend->optimizer_step(hyper, true, parameters.data(), gradients.data(), m.data(), v.data(), 2, TensorView{},
                          scalars.data());
  const auto p = parameters.get();
  EXPECT_NEAR(p[0], 0.9f, 1e-6);  // first AdamW step: lr * sign(g)
  EXPECT_NEAR(p[1], -0.9f, 1e-6);
}

// The update is element-wise: a range updated in pieces, cut anywhere (off the vector width and alignment), gets the
// bits of the range updated whole, parameters, state and working copy. The sharded optimizer relies on it.
TEST_F(CpuKernels, OptimizerStepOfARangeInPiecesGivesTheWholeRangesBits) {
  const std::int64_t count = 10'007;
  const std::vector<std::int64_t> cuts{0, 1, 18, 4096, 4099, 7777, count};
  OptimizerHyper adamw;
  adamw.type = OptimizerType::adamw;
  adamw.weight_decay = 0.1f;
  OptimizerHyper sgd;
  sgd.type = OptimizerType::sgd;
  sgd.momentum = 0.9f;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01f;
  for (const auto& [hyper, working_dtype] :
       {std::pair{adamw, DType::bf16}, std::pair{adamw, DType::f32}, std::pair{sgd, DType::f16}}) {
    SCOPED_TRACE(::testing::Message() << (hyper.type == OptimizerType::adamw ? "adamw " : "sgd ")
                                      << dtype_name(working_dtype));
    const bool with_working = working_dtype != DType::f32;
    const auto values = [&](std::uint64_t seed, double scale) {
      std::vector<float> out;
      for (double value : random_values(static_cast<std::size_t>(count), seed))
        out.push_back(static_cast<float>(value * scale));
      return out;
    };
    const std::vector<float> parameters = values(501, 1.0), gradients = values(502, 8.0), first = values(503, 0.1),
                             second = values(504, 0.01);
    std::vector<float> second_positive;
    for (float v : second) second_positive.push_back(std::fabs(v));
    StepScalars s;
    s.loss_scale = 8.0f;
    s.learning_rate = 0.01f;
    s.clip_coefficient = 0.7f;
    s.applied_steps = 3;
    TestArray<StepScalars> scalars(*backend, std::vector<StepScalars>{s});
    TestArray<float> grad(*backend, gradients);
    std::vector<std::vector<float>> results;
    std::vector<std::vector<double>> working_results;
    for (const bool pieces : {false, true}) {
      TestArray<float> p(*backend, parameters), m(*backend, first), v(*backend, second_positive);
      TestTensor working(*backend, working_dtype, 1, count);
      working.poison();
      const auto update = [&](std::int64_t begin, std::int64_t end) {
        const TensorView view{with_working ? static_cast<char*>(working.view().data) +
                                                 begin * static_cast<std::int64_t>(dtype_size(working_dtype))
                                           : nullptr,
                              working_dtype, end - begin, 1};
        backend->optimizer_step(hyper, true, p.data() + begin, grad.data() + begin, m.data() + begin,
                                hyper.type == OptimizerType::adamw ? v.data() + begin : nullptr, end - begin, view,
                                scalars.data());
      };
      if (pieces) {
        for (std::size_t c = 0; c + 1 < cuts.size(); ++c) update(cuts[c], cuts[c + 1]);
      } else {
        update(0, count);
      }
      results.push_back(p.get());
      results.push_back(m.get());
      results.push_back(v.get());
      if (with_working) working_results.push_back(working.get());
    }
    EXPECT_NE(results[0], parameters) << "the update changed nothing";
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(results[k].size(), results[k + 3].size());
      EXPECT_EQ(std::memcmp(results[k].data(), results[k + 3].data(), results[k].size() * sizeof(float)), 0)
          << (k == 0   ? "parameters"
              : k == 1 ? "first state"
                       : "second state");
    }
    if (with_working) EXPECT_EQ(working_results[0], working_results[1]) << "working copy";
  }
}

// ---- loss scaler ----

TEST_F(CpuKernels, FinishStepFollowsTheScalerTrajectory) {
  LossScalerConfig config;
  config.enabled = true;
  config.growth_interval = 3;
  config.growth_factor = 2.0f;
  config.backoff_factor = 0.5f;
  StepScalars start;
  start.loss_scale = 65536.0f;
  TestArray<StepScalars> scalars(*backend, std::vector<StepScalars>{start});
  // (found_nonfinite, then expected scale, growth tracker, applied steps, consecutive skips), worked out by hand
  struct Row {
    int nonfinite;
    float scale;
    int tracker, applied, skips;
  };
  const Row rows[] = {
      {1, 32768, 0, 0, 1}, {1, 16384, 0, 0, 2}, {0, 16384, 1, 1, 0}, {0, 16384, 2, 2, 0}, {0, 32768, 0, 3, 0},
      {0, 32768, 1, 4, 0}, {1, 16384, 0, 4, 1}, {0, 16384, 1, 5, 0}, {0, 16384, 2, 6, 0}, {0, 32768, 0, 7, 0},
  };
  for (const Row& row : rows) {
    auto s = scalars.get()[0];
    s.found_nonfinite = row.nonfinite;
    scalars.set({s});
    backend->finish_step(config, scalars.data());
    s = scalars.get()[0];
    EXPECT_EQ(s.loss_scale, row.scale);
    EXPECT_EQ(s.growth_tracker, row.tracker);
    EXPECT_EQ(s.applied_steps, row.applied);
    EXPECT_EQ(s.consecutive_skips, row.skips);
  }
}

}  // namespace
}  // namespace hpctrain
