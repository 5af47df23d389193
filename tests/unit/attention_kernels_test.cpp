// Tests of the CPU backend's sequence kernels: fused attention forward (output and row log-sum-exp) and backward
// against a naive f64 reference that forms the whole T x T probability matrix, in every storage dtype, causal and not,
// with sequences that are not a multiple of the 64-position tile (and T = 1), head_dim 16 and 64, several heads and
// sequences; the backward also against central finite differences in f64; results bit-identical for different OpenMP
// thread counts; dropout on the probabilities (the reference regenerates the mask per element from the same keys):
// forward, backward and finite differences with the mask fixed, the dropped fraction, the mask's independence of the
// batch row, thread count and tile, and its dependence on step, layer, seed and head; the embedding lookup and its
// gradient (repeated ids, accumulate on and off) and sequence pooling (mean, first) against references.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/math.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;

// ---- naive f64 reference: the whole probability matrix of each (sequence, head) ----
struct HeadIndex {
  const AttentionGeometry& g;
  // Element d of position t's part (0 = q, 1 = k, 2 = v) of head h in sequence b, in qkv (rows of 3 * width).
  [[nodiscard]] std::size_t qkv(std::int64_t b, std::int64_t t, int part, std::int64_t h, std::int64_t d) const {
    return static_cast<std::size_t>((b * g.sequence + t) * 3 * g.width() + part * g.width() + h * g.head_dim + d);
  }
  [[nodiscard]] std::size_t out(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) const {
    return static_cast<std::size_t>((b * g.sequence + t) * g.width() + h * g.head_dim + d);
  }
};

// Dropout's factor of element (query i, key j) of head h of sequence b: keep / (1 - p) or 0, drawn element by element
// from kernels/math.hpp's keys (the kernels walk groups of four); 1 without dropout.
double dropout_factor(const AttentionGeometry& g, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const AttentionDropout& dropout = g.dropout;
  if (!dropout.active()) return 1.0;
  const std::uint64_t index = kernel_math::attention_dropout_index(dropout.sample_ids[b], g.heads, h, g.sequence, i, j);
  const bool keep = kernel_math::attention_dropout_keep(kernel_math::dropout_key(dropout.seed, dropout.step),
                                                        dropout.layer, index, dropout.p);
  return keep ? 1.0 / (1.0 - static_cast<double>(dropout.p)) : 0.0;
}

// probabilities (T x T) of head h of sequence b; lse (T).
void reference_probabilities(const AttentionGeometry& g, const std::vector<double>& qkv, std::int64_t b, std::int64_t h,
                             std::vector<double>& probabilities, std::vector<double>& lse) {
  const HeadIndex at{g};
  const std::int64_t n = g.sequence;
  probabilities.assign(static_cast<std::size_t>(n * n), 0.0);
  lse.assign(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t visible = g.causal ? i + 1 : n;
    double maximum = -std::numeric_limits<double>::infinity();
    std::vector<double> scores(static_cast<std::size_t>(visible));
    for (std::int64_t j = 0; j < visible; ++j) {
      double dot = 0.0;
      for (std::int64_t d = 0; d < g.head_dim; ++d) dot += qkv[at.qkv(b, i, 0, h, d)] * qkv[at.qkv(b, j, 1, h, d)];
      scores[static_cast<std::size_t>(j)] = dot * static_cast<double>(g.scale);
      maximum = std::max(maximum, scores[static_cast<std::size_t>(j)]);
    }
    double sum = 0.0;
    for (const double score : scores) sum += std::exp(score - maximum);
    lse[static_cast<std::size_t>(i)] = maximum + std::log(sum);
    for (std::int64_t j = 0; j < visible; ++j)
      probabilities[static_cast<std::size_t>(i * n + j)] =
          std::exp(scores[static_cast<std::size_t>(j)] - lse[static_cast<std::size_t>(i)]);
  }
}

struct ForwardResult {
  std::vector<double> out, lse;
};

ForwardResult reference_forward(const AttentionGeometry& g, const std::vector<double>& qkv) {
  const HeadIndex at{g};
  const std::int64_t n = g.sequence;
  ForwardResult result{std::vector<double>(static_cast<std::size_t>(g.batch * n * g.width())),
                       std::vector<double>(static_cast<std::size_t>(g.batch * g.heads * n))};
  std::vector<double> p, lse;
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t h = 0; h < g.heads; ++h) {
      reference_probabilities(g, qkv, b, h, p, lse);
      for (std::int64_t i = 0; i < n; ++i) {
        result.lse[static_cast<std::size_t>((b * g.heads + h) * n + i)] = lse[static_cast<std::size_t>(i)];
        for (std::int64_t d = 0; d < g.head_dim; ++d) {
          double sum = 0.0;
          for (std::int64_t j = 0; j < n; ++j)
            sum += p[static_cast<std::size_t>(i * n + j)] * dropout_factor(g, b, h, i, j) * qkv[at.qkv(b, j, 2, h, d)];
          result.out[at.out(b, i, h, d)] = sum;
        }
      }
    }
  return result;
}

// dqkv from dout: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K, dK = scale dS^T Q. With
// dropout (factors F): out = (P F) V, so dV = (P F)^T dO and dP = (dO V^T) F, by the chain rule alone (the kernels'
// D = rowsum(dO O) shortcut is not used here).
std::vector<double> reference_backward(const AttentionGeometry& g, const std::vector<double>& qkv,
                                       const std::vector<double>& dout) {
  const HeadIndex at{g};
  const std::int64_t n = g.sequence;
  const auto scale = static_cast<double>(g.scale);
  std::vector<double> dqkv(qkv.size(), 0.0), p, lse;
  std::vector<double> ds(static_cast<std::size_t>(n * n));
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t h = 0; h < g.heads; ++h) {
      reference_probabilities(g, qkv, b, h, p, lse);
      for (std::int64_t i = 0; i < n; ++i) {
        double row = 0.0;
        for (std::int64_t j = 0; j < n; ++j) {
          double dp = 0.0;
          for (std::int64_t d = 0; d < g.head_dim; ++d) dp += dout[at.out(b, i, h, d)] * qkv[at.qkv(b, j, 2, h, d)];
          dp *= dropout_factor(g, b, h, i, j);
          ds[static_cast<std::size_t>(i * n + j)] = dp;
          row += p[static_cast<std::size_t>(i * n + j)] * dp;
        }
        for (std::int64_t j = 0; j < n; ++j) {
          const auto ij = static_cast<std::size_t>(i * n + j);
          ds[ij] = p[ij] * (ds[ij] - row);
        }
      }
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          const auto ij = static_cast<std::size_t>(i * n + j);
          const double dropped = p[ij] * dropout_factor(g, b, h, i, j);
          for (std::int64_t d = 0; d < g.head_dim; ++d) {
            dqkv[at.qkv(b, i, 0, h, d)] += scale * ds[ij] * qkv[at.qkv(b, j, 1, h, d)];
            dqkv[at.qkv(b, j, 1, h, d)] += scale * ds[ij] * qkv[at.qkv(b, i, 0, h, d)];
            dqkv[at.qkv(b, j, 2, h, d)] += dropped * dout[at.out(b, i, h, d)];
          }
        }
    }
  return dqkv;
}

// ---- the backend's kernels on one set of inputs ----
class AttentionRun {
 public:
  AttentionRun(Backend& backend, const AttentionGeometry& g, DType dtype)
      : backend_(backend),
        g_(g),
        dtype_(dtype),
        lse_dtype_(master_of(dtype)),
        qkv(backend, dtype, g.batch * g.sequence, 3 * g.width()),
        out(backend, dtype, g.batch * g.sequence, g.width()),
        dout(backend, dtype, g.batch * g.sequence, g.width()),
        dqkv(backend, dtype, g.batch * g.sequence, 3 * g.width()),
        lse(backend, lse_dtype_, g.batch * g.heads, g.sequence) {}

  void forward() {
    out.poison();
    lse.poison();
    backend_.attention_forward(g_, qkv.view(), out.view(), lse.data());
  }
  void backward() {
    dqkv.poison();
    backend_.attention_backward(g_, qkv.view(), out.view(), dout.view(), lse.data(), dqkv.view());
  }
  // The raw bytes of the outputs (bit-identity checks).
  [[nodiscard]] std::vector<unsigned char> output_bytes() const {
    std::vector<unsigned char> bytes;
    for (const TestTensor* tensor : {&out, &lse, &dqkv}) {
      const auto values = tensor->get();
      const auto* raw = reinterpret_cast<const unsigned char*>(values.data());
      bytes.insert(bytes.end(), raw, raw + values.size() * sizeof(double));
    }
    return bytes;
  }

 private:
  Backend& backend_;
  AttentionGeometry g_;
  DType dtype_, lse_dtype_;

 public:
  TestTensor qkv, out, dout, dqkv, lse;
};

class AttentionKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend();
};

// Shapes that cover one position, one partial tile, a tile plus a few, three tiles with a partial one, head_dim 16
// and 64, one and several heads and sequences.
std::vector<AttentionGeometry> attention_shapes() {
  std::vector<AttentionGeometry> shapes;
  for (const bool causal : {true, false}) {
    shapes.push_back(make_attention(2, 1, 3, 16, causal));
    shapes.push_back(make_attention(1, 37, 2, 64, causal));
    shapes.push_back(make_attention(2, 70, 3, 16, causal));
    shapes.push_back(make_attention(1, 150, 2, 64, causal));
  }
  return shapes;
}

// Output and gradient tolerance per dtype: f64 is exact up to summation order; fp32 arithmetic for the others, whose
// stored results are rounded to the dtype (the backward also reads the rounded output).
double attention_tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 2.0 * tolerance(dtype); }
double lse_tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }

TEST_F(AttentionKernels, ForwardAndBackwardMatchTheNaiveReference) {
  for (const DType dtype : all_dtypes)
    for (const AttentionGeometry& g : attention_shapes()) {
      SCOPED_TRACE(describe(g, dtype));
      AttentionRun run(*backend, g, dtype);
      // Scores of a few units: the softmax is far from uniform, so a wrong mask or a lost block shows.
      const auto qkv = run.qkv.randomize(11 + static_cast<std::uint64_t>(g.sequence), -2.0, 2.0);
      const auto dout = run.dout.randomize(23 + static_cast<std::uint64_t>(g.sequence));
      run.forward();
      const ForwardResult want = reference_forward(g, qkv);
      EXPECT_LE(relative_error(run.out.get(), want.out), attention_tolerance(dtype));
      EXPECT_LE(relative_error(run.lse.get(), want.lse), lse_tolerance(dtype));
      run.backward();
      EXPECT_LE(relative_error(run.dqkv.get(), reference_backward(g, qkv, dout)), 2.0 * attention_tolerance(dtype));
    }
}

// Scores of hundreds of units (their exp overflows fp32): the running maximum keeps every exponent <= 0, and the
// results are as accurate as for small scores.
TEST_F(AttentionKernels, LargeScoresStayFinite) {
  for (const bool causal : {true, false}) {
    const AttentionGeometry g = make_attention(1, 150, 2, 64, causal);
    SCOPED_TRACE(describe(g, DType::f32));
    AttentionRun run(*backend, g, DType::f32);
    const auto qkv = run.qkv.randomize(31, -8.0, 8.0);
    const auto dout = run.dout.randomize(32);
    run.forward();
    run.backward();
    const ForwardResult want = reference_forward(g, qkv);
    EXPECT_LE(relative_error(run.out.get(), want.out), attention_tolerance(DType::f32));
    EXPECT_LE(relative_error(run.lse.get(), want.lse), 1e-5);
    EXPECT_LE(relative_error(run.dqkv.get(), reference_backward(g, qkv, dout)), 2.0 * attention_tolerance(DType::f32));
  }
}

// The gradient is that of the forward itself: central differences of sum(out * w) in f64, w random (the dout), at
// every 5th entry of qkv (5 is prime to the 96 columns, so every column of q, k and v is checked in some row, and
// every row, both tiles of the sequence included, in some column).
TEST_F(AttentionKernels, BackwardMatchesFiniteDifferences) {
  for (const bool causal : {true, false}) {
    const AttentionGeometry g = make_attention(1, 67, 2, 16, causal);
    SCOPED_TRACE(describe(g, DType::f64));
    AttentionRun run(*backend, g, DType::f64);
    auto point = run.qkv.randomize(5, -2.0, 2.0);
    const auto weights = run.dout.randomize(6);
    run.forward();
    run.backward();
    const auto gradient = run.dqkv.get();
    const auto objective = [&] {
      run.qkv.set(point);
      run.forward();
      return dot(run.out.get(), weights);
    };
    std::vector<double> checked, differences;
    for (std::size_t i = 0; i < point.size(); i += 5) {
      std::vector<double> entry{point[i]};
      const auto difference = central_differences(entry, 1e-5, [&] {
        point[i] = entry[0];
        return objective();
      });
      point[i] = entry[0];
      checked.push_back(gradient[i]);
      differences.push_back(difference[0]);
    }
    EXPECT_LE(relative_error(checked, differences), 1e-7);
  }
}

// ---- dropout on the probabilities ----
// Global sample indices of the batch's sequences (host memory: the CPU backend's); large ones too, so the 64-bit
// element index is exercised.
const std::int64_t dropout_samples[] = {1000003, 17, 5};

AttentionGeometry with_dropout(AttentionGeometry g, float p, std::uint32_t step = 7, std::uint32_t layer = 3,
                               std::uint64_t seed = 42, const std::int64_t* samples = dropout_samples) {
  g.dropout = {p, seed, step, layer, samples};
  return g;
}

// Each thread owns whole tiles (forward) and whole heads (backward): the thread count changes no bit, with dropout too
// (its mask is a function of the element, not of the thread that forms it).
TEST_F(AttentionKernels, ResultsAreBitIdenticalForAnyThreadCount) {
  const int saved_threads = omp_get_max_threads();
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const bool causal : {true, false})
      for (const float p : {0.0f, 0.2f}) {
        const AttentionGeometry g = with_dropout(make_attention(2, 150, 3, 64, causal), p);
        SCOPED_TRACE(describe(g, dtype) + " dropout " + std::to_string(p));
        std::vector<std::vector<unsigned char>> results;
        for (const int threads : {1, 3}) {
          omp_set_num_threads(threads);
          AttentionRun run(*backend, g, dtype);
          run.qkv.randomize(7, -2.0, 2.0);
          run.dout.randomize(8);
          run.forward();
          run.backward();
          results.push_back(run.output_bytes());
        }
        EXPECT_TRUE(results[0] == results[1]);
      }
  omp_set_num_threads(saved_threads);
}

// The kernels drop the elements the reference regenerates from the same keys, and their gradient is that of the
// dropped forward (dS = P (dP' F - D), dV from P F): every dtype and shape of the plain test, p = 0.25.
TEST_F(AttentionKernels, DropoutMatchesTheNaiveReferenceWithTheSameMask) {
  for (const DType dtype : all_dtypes)
    for (const AttentionGeometry& plain : attention_shapes()) {
      const AttentionGeometry g = with_dropout(plain, 0.25f);
      SCOPED_TRACE(describe(g, dtype) + " dropout 0.25");
      AttentionRun run(*backend, g, dtype);
      const auto qkv = run.qkv.randomize(41 + static_cast<std::uint64_t>(g.sequence), -2.0, 2.0);
      const auto dout = run.dout.randomize(43 + static_cast<std::uint64_t>(g.sequence));
      run.forward();
      const ForwardResult want = reference_forward(g, qkv);
      EXPECT_LE(relative_error(run.out.get(), want.out), attention_tolerance(dtype));
      EXPECT_LE(relative_error(run.lse.get(), want.lse), lse_tolerance(dtype));  // the undropped softmax's
      run.backward();
      EXPECT_LE(relative_error(run.dqkv.get(), reference_backward(g, qkv, dout)), 2.0 * attention_tolerance(dtype));
      // The mask matters: without it the output is far from the kernel's (one position (T = 1) keeps or drops its
      // single key, so it is checked by the other shapes).
      if (g.sequence > 1) EXPECT_GT(relative_error(run.out.get(), reference_forward(plain, qkv).out), 0.05);
    }
}

// With the mask fixed (same seed, step, layer, samples), the backward is the derivative of the dropped forward:
// central differences of sum(out * w) in f64 at every 5th entry of qkv.
TEST_F(AttentionKernels, DropoutBackwardMatchesFiniteDifferences) {
  for (const bool causal : {true, false}) {
    const AttentionGeometry g = with_dropout(make_attention(1, 67, 2, 16, causal), 0.3f);
    SCOPED_TRACE(describe(g, DType::f64) + " dropout 0.3");
    AttentionRun run(*backend, g, DType::f64);
    auto point = run.qkv.randomize(15, -2.0, 2.0);
    const auto weights = run.dout.randomize(16);
    run.forward();
    run.backward();
    const auto gradient = run.dqkv.get();
    ASSERT_FALSE(has_nan(gradient));
    std::vector<double> checked, differences;
    for (std::size_t i = 0; i < point.size(); i += 5) {
      std::vector<double> entry{point[i]};
      const auto difference = central_differences(entry, 1e-5, [&] {
        point[i] = entry[0];
        run.qkv.set(point);
        run.forward();
        return dot(run.out.get(), weights);
      });
      point[i] = entry[0];
      checked.push_back(gradient[i]);
      differences.push_back(difference[0]);
    }
    EXPECT_LE(relative_error(checked, differences), 1e-7);
  }
}

// Queries of zero make every probability 1 / T (not causal) and values of one make each output element the kept
// fraction of its query's keys over (1 - p): over 2 x 4 heads x 256 x 256 elements the kept fraction is 1 - p within
// 5 standard deviations. The masks of two heads, and of another step, layer or seed, differ.
TEST_F(AttentionKernels, DropoutKeepsAFractionNearOneMinusP) {
  for (const float p : {0.1f, 0.5f}) {
    const AttentionGeometry g = with_dropout(make_attention(2, 256, 4, 8, false), p);
    SCOPED_TRACE("dropout " + std::to_string(p));
    const auto kept_fractions = [&](const AttentionGeometry& geometry) {
      AttentionRun run(*backend, geometry, DType::f64);
      std::vector<double> qkv = run.qkv.randomize(3);
      for (std::size_t i = 0; i < qkv.size(); ++i) {
        const auto part = static_cast<std::int64_t>(i) % (3 * g.width()) / g.width();  // 0 q, 1 k, 2 v
        if (part != 1) qkv[i] = part == 0 ? 0.0 : 1.0;
      }
      run.qkv.set(qkv);
      run.forward();
      std::vector<double> fractions;  // per (row, head): the output's first element times (1 - p)
      const auto out = run.out.get();
      for (std::size_t i = 0; i < out.size(); i += static_cast<std::size_t>(g.head_dim))
        fractions.push_back(out[i] * (1.0 - static_cast<double>(p)));
      return fractions;
    };
    const std::vector<double> fractions = kept_fractions(g);
    double mean = 0.0;
    for (const double fraction : fractions) mean += fraction / static_cast<double>(fractions.size());
    const double elements = static_cast<double>(g.batch * g.heads * g.sequence * g.sequence);
    EXPECT_NEAR(mean, 1.0 - p, 5.0 * std::sqrt(p * (1.0 - p) / elements));
    EXPECT_NE(fractions[0], fractions[1]);  // heads 0 and 1 of position 0
    for (const AttentionGeometry& other :
         {with_dropout(g, p, 8), with_dropout(g, p, 7, 4), with_dropout(g, p, 7, 3, 43)})
      EXPECT_NE(kept_fractions(other), fractions);
  }
}

// A sequence's mask is keyed by its global sample index, not by its row in the batch: sample 5 alone (one rank's share)
// gives the bits it gives as the third row of a batch of three (causal T = 150, several tiles).
TEST_F(AttentionKernels, DropoutMaskFollowsTheSampleNotTheBatchRow) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const AttentionGeometry whole = with_dropout(make_attention(3, 150, 2, 16, true), 0.2f);
    const AttentionGeometry alone =
        with_dropout(make_attention(1, 150, 2, 16, true), 0.2f, 7, 3, 42, dropout_samples + 2);
    SCOPED_TRACE(describe(whole, dtype));
    AttentionRun batch(*backend, whole, dtype), single(*backend, alone, dtype);
    const auto qkv = batch.qkv.randomize(51, -2.0, 2.0);
    const auto dout = batch.dout.randomize(52);
    const std::size_t qkv_first = 2 * 150 * 3 * whole.width(), out_first = 2 * 150 * whole.width();
    single.qkv.set(std::vector<double>(qkv.begin() + static_cast<std::ptrdiff_t>(qkv_first), qkv.end()));
    single.dout.set(std::vector<double>(dout.begin() + static_cast<std::ptrdiff_t>(out_first), dout.end()));
    for (AttentionRun* run : {&batch, &single}) {
      run->forward();
      run->backward();
    }
    const auto tail = [](const std::vector<double>& values, std::size_t first) {
      return std::vector<double>(values.begin() + static_cast<std::ptrdiff_t>(first), values.end());
    };
    EXPECT_EQ(tail(batch.out.get(), out_first), single.out.get());
    EXPECT_EQ(tail(batch.dqkv.get(), qkv_first), single.dqkv.get());
    EXPECT_EQ(tail(batch.lse.get(), 2 * 150 * 2), single.lse.get());
  }
}

TEST_F(AttentionKernels, ShapesThatDoNotMatchTheGeometryAreRejected) {
  const AttentionGeometry g = make_attention(2, 8, 2, 16, true);
  AttentionRun run(*backend, g, DType::f32);
  TestTensor narrow(*backend, DType::f32, g.batch * g.sequence, 2 * g.width());
  EXPECT_ANY_THROW(backend->attention_forward(g, narrow.view(), run.out.view(), run.lse.data()));
}

// ---- embedding ----
class EmbeddingKernels : public AttentionKernels {};

// Ids with repeats (several rows of one id, ids used once, ids not used).
std::vector<std::int32_t> embedding_ids(std::int64_t rows, std::int32_t vocabulary) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r)
    ids[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * r * 7 + 3) % vocabulary);
  return ids;
}

TEST_F(EmbeddingKernels, ForwardGathersRowsInTheActivationDtype) {
  const std::int64_t rows = 300, cols = 40;
  const std::int32_t vocabulary = 97;
  const auto ids = embedding_ids(rows, vocabulary);
  TestArray<std::int32_t> id_array(*backend, ids);
  for (const DType dtype : all_dtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    TestTensor table(*backend, master_of(dtype), vocabulary, cols);
    const auto table_values = table.randomize(3);
    TestTensor y(*backend, dtype, rows, cols);
    y.poison();
    backend->embedding_forward(id_array.data(), table.data(), vocabulary, y.view());
    std::vector<double> want(static_cast<std::size_t>(rows * cols));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        want[static_cast<std::size_t>(r * cols + c)] =
            table_values[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)] * cols + c)];
    EXPECT_EQ(y.get(), quantized(dtype, want));  // one rounding of the master value
  }
}

TEST_F(EmbeddingKernels, BackwardSumsTheRowsOfEachId) {
  const std::int64_t rows = 300, cols = 40;
  const std::int32_t vocabulary = 97;
  const auto ids = embedding_ids(rows, vocabulary);
  TestArray<std::int32_t> id_array(*backend, ids);
  for (const DType dtype : all_dtypes)
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (accumulate ? " accumulate" : " overwrite"));
      TestTensor dy(*backend, dtype, rows, cols);
      const auto gradient = dy.randomize(4);
      TestTensor dtable(*backend, master_of(dtype), vocabulary, cols);
      std::vector<double> want(static_cast<std::size_t>(vocabulary * cols), 0.0);
      if (accumulate)
        want = dtable.randomize(5);
      else
        dtable.poison();  // rows of unused ids must be written (zero) too
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
          want[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)] * cols + c)] +=
              gradient[static_cast<std::size_t>(r * cols + c)];
      backend->embedding_backward(id_array.data(), dy.view(), vocabulary, dtable.data(), accumulate);
      EXPECT_LE(relative_error(dtable.get(), want), dtype == DType::f64 ? 1e-14 : 1e-6);
    }
}

TEST_F(EmbeddingKernels, IdsOutsideTheVocabularyAreInputErrors) {
  TestArray<std::int32_t> ids(*backend, std::vector<std::int32_t>{0, 3, 10});
  TestTensor table(*backend, DType::f32, 10, 4);
  table.randomize(1);
  TestTensor y(*backend, DType::f32, 3, 4);
  EXPECT_THROW(backend->embedding_forward(ids.data(), table.data(), 10, y.view()), InputError);
  EXPECT_THROW(backend->embedding_backward(ids.data(), y.view(), 10, table.data(), true), InputError);
}

TEST_F(EmbeddingKernels, BackwardIsBitIdenticalForAnyThreadCount) {
  const std::int64_t rows = 4096, cols = 64;
  const std::int32_t vocabulary = 300;
  TestArray<std::int32_t> id_array(*backend, embedding_ids(rows, vocabulary));
  TestTensor dy(*backend, DType::bf16, rows, cols);
  dy.randomize(9);
  const int saved_threads = omp_get_max_threads();
  std::vector<std::vector<double>> results;
  for (const int threads : {1, 3}) {
    omp_set_num_threads(threads);
    TestTensor dtable(*backend, DType::f32, vocabulary, cols);
    dtable.poison();
    backend->embedding_backward(id_array.data(), dy.view(), vocabulary, dtable.data(), false);
    results.push_back(dtable.get());
  }
  omp_set_num_threads(saved_threads);
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(double)), 0);
}

// Sequence pooling: (rows, T * C) -> (rows, C) by the mean over positions or the first position, and its backward,
// against f64 references, with T = 1, 7 and 130 (a large T: the mean's fp32 sum), outputs poisoned.
class SequencePoolKernels : public AttentionKernels {};

TEST_F(SequencePoolKernels, ForwardAndBackwardMatchReferences) {
  const std::int64_t rows = 5, channels = 12;
  for (const DType dtype : all_dtypes)
    for (const std::int64_t sequence : {1, 7, 130})
      for (const SequencePooling mode : {SequencePooling::mean, SequencePooling::first}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " T = " + std::to_string(sequence) +
                     (mode == SequencePooling::mean ? " mean" : " first"));
        TestTensor x(*backend, dtype, rows, sequence * channels), y(*backend, dtype, rows, channels);
        const auto input = x.randomize(31 + static_cast<std::uint64_t>(sequence));
        y.poison();
        backend->sequence_pool_forward(mode, sequence, x.view(), y.view());
        std::vector<double> want(static_cast<std::size_t>(rows * channels), 0.0);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < channels; ++c) {
            double& value = want[static_cast<std::size_t>(r * channels + c)];
            for (std::int64_t t = 0; t < (mode == SequencePooling::mean ? sequence : 1); ++t)
              value += input[static_cast<std::size_t>(r * sequence * channels + t * channels + c)];
            if (mode == SequencePooling::mean) value /= static_cast<double>(sequence);
          }
        EXPECT_LE(relative_error(y.get(), want), tolerance(dtype));

        TestTensor dy(*backend, dtype, rows, channels), dx(*backend, dtype, rows, sequence * channels);
        const auto gradient = dy.randomize(37);
        dx.poison();
        backend->sequence_pool_backward(mode, sequence, dy.view(), dx.view());
        std::vector<double> want_dx(dx.size());
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t t = 0; t < sequence; ++t)
            for (std::int64_t c = 0; c < channels; ++c) {
              const double g = gradient[static_cast<std::size_t>(r * channels + c)];
              want_dx[static_cast<std::size_t>((r * sequence + t) * channels + c)] =
                  mode == SequencePooling::mean ? g / static_cast<double>(sequence) : (t == 0 ? g : 0.0);
            }
        EXPECT_LE(relative_error(dx.get(), want_dx), tolerance(dtype));
      }
}

}  // namespace
}  // namespace hpctrain
