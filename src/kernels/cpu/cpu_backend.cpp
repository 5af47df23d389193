// The CPU backend: host memory, OpenMP loops around the shared arithmetic of kernels/math.hpp, and oneDNN for matrix
// products (cpu_gemm.cpp). It is the reference the CUDA backend is tested against, so every kernel supports every
// storage dtype (f32, bf16, f16, and f64 for gradient checks) with fp32 arithmetic (fp64 for f64).
//
// Reductions (gradient statistics, loss sums, column sums) have a fixed order whatever the thread count: results are
// bit-identical for any OMP_NUM_THREADS. A backend is driven by one host thread at a time (like a CUDA stream); its
// scratch buffers are not shared between concurrent calls.
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "cpu_class_hits.hpp"
#include "cpu_common.hpp"
#include "cpu_convolution.hpp"
#include "cpu_gemm.hpp"
#include "cpu_gradient_norm.hpp"
#include "cpu_philox.hpp"
#include "cpu_sequence.hpp"
#include "cpu_spatial.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/math.hpp"

namespace hpctrain {
namespace {

namespace km = kernel_math;

// Below this many elements a loop runs on one thread: the fork/join costs more than the work.
constexpr std::int64_t parallel_threshold = 16384;
// Columns summed together by one thread in column reductions (bias and layernorm parameter gradients).
constexpr std::int64_t column_block = 64;
// Within a chunk, element i goes to lane i % statistics_lanes: independent sums the compiler can keep in vector
// registers (a single running sum is one long dependency chain), still in a fixed order.
constexpr std::int64_t statistics_lanes = 16;
// Each lane sums the squares of a block's 16 elements in fp32 (fp32 vectors: twice the width of fp64 ones, and no
// conversions), then adds that into its fp64 sum. A block's fp32 sum has a relative error below 17 u (u = 2^-24: 16
// additions of positive terms and the rounding of each square), so the sum of squares stays within 17 u of the exact
// one and the norm within 9 u, plus its final rounding to fp32 (tests/unit/cpu_optimizer_kernels_test.cpp checks 1e-6
// against an fp64 reference). A block whose fp32 sum may have lost terms, because it is below 2^-90 (squares under
// 2^-126 flush to zero) or is not finite (a square overflowed, or an input is Inf/NaN), is summed again in fp64 --
// unless every element is +-0 (dead ReLU units make such blocks common): its squares add exactly +0 in any precision,
// so it is skipped, with the same result as the fp64 sum.
constexpr std::int64_t statistics_block = 16 * statistics_lanes;

// Whether all of block[0, statistics_block) are +0 or -0 (bit patterns, so a subnormal is not zero here even where
// the FPU reads it as zero).
bool all_zero(const float* __restrict block) {
  std::uint32_t bits = 0;
#pragma omp simd reduction(| : bits)
  for (std::int64_t i = 0; i < statistics_block; ++i) bits |= std::bit_cast<std::uint32_t>(block[i]) & 0x7fffffffu;
  return bits == 0;
}

}  // namespace

double cpu::chunk_sum_of_squares(const float* __restrict gradients, std::int64_t begin, std::int64_t end,
                                 int& nonfinite, NormBlockPaths* paths) {
  double lanes[statistics_lanes] = {};
  int flags = 0;
  std::int64_t i = begin;
  for (; i + statistics_block <= end; i += statistics_block) {
    float block[statistics_lanes] = {};
    for (std::int64_t j = i; j < i + statistics_block; j += statistics_lanes)
#pragma omp simd reduction(| : flags)
      for (std::int64_t lane = 0; lane < statistics_lanes; ++lane) {
        const float g = gradients[j + lane];
        flags |= km::is_finite(g) ? 0 : 1;
        block[lane] += g * g;
      }
    float total = 0.0f;
    for (const float lane : block) total += lane;
    if (total >= 0x1p-90f && total <= std::numeric_limits<float>::max()) {
      for (std::int64_t lane = 0; lane < statistics_lanes; ++lane) lanes[lane] += static_cast<double>(block[lane]);
      if (paths != nullptr) ++paths->fp32;
      continue;
    }
    if (total == 0.0f && all_zero(gradients + i)) {  // adds +0 to sums >= +0: nothing to do
      if (paths != nullptr) ++paths->zero;
      continue;
    }
    if (paths != nullptr) ++paths->fp64;
    for (std::int64_t lane = 0; lane < statistics_lanes; ++lane) {
      double sum = 0.0;
      for (std::int64_t j = i + lane; j < i + statistics_block; j += statistics_lanes)
        sum += static_cast<double>(gradients[j]) * static_cast<double>(gradients[j]);
      lanes[lane] += sum;
    }
  }
  for (; i < end; ++i) {  // the buffer's last partial block
    const float g = gradients[i];
    flags |= km::is_finite(g) ? 0 : 1;
    lanes[i % statistics_lanes] += static_cast<double>(g) * static_cast<double>(g);
  }
  nonfinite = flags;
  double sum = 0.0;
  for (const double lane : lanes) sum += lane;
  return sum;
}

namespace {

// The fused optimizer passes over one range. Restrict-qualified locals (not captures) and no errno from sqrt
// (-fno-math-errno) let the compiler vectorise them: the pass is memory-bound only once it is vectorised.
template <class W>
void adamw_range(float* __restrict parameters, float* __restrict first_moment, float* __restrict second_moment,
                 const float* __restrict gradients, W* __restrict working, std::int64_t count, float unscale,
                 float clip, const km::AdamWConstants<float> constants) {
#pragma omp parallel for simd schedule(static) if (count > parallel_threshold)
  for (std::int64_t i = 0; i < count; ++i) {
    float parameter = parameters[i], m = first_moment[i], v = second_moment[i];
    km::adamw_update(parameter, m, v, gradients[i] * unscale * clip, constants);
    parameters[i] = parameter;
    first_moment[i] = m;
    second_moment[i] = v;
    if constexpr (!std::is_void_v<W>) working[i] = cpu::convert_value<W>(parameter);
  }
}

template <class W>
void sgd_range(float* __restrict parameters, float* __restrict momentum_buffer, const float* __restrict gradients,
               W* __restrict working, std::int64_t count, float unscale, float clip, float learning_rate,
               const OptimizerHyper& hyper, float weight_decay, bool first_step) {
  const float momentum = hyper.momentum;
  const bool nesterov = hyper.nesterov;
#pragma omp parallel for simd schedule(static) if (count > parallel_threshold)
  for (std::int64_t i = 0; i < count; ++i) {
    float parameter = parameters[i], buffer = momentum_buffer != nullptr ? momentum_buffer[i] : 0.0f;
    km::sgd_update(parameter, buffer, gradients[i] * unscale * clip, learning_rate, momentum, weight_decay, nesterov,
                   first_step);
    parameters[i] = parameter;
    if (momentum_buffer != nullptr) momentum_buffer[i] = buffer;
    if constexpr (!std::is_void_v<W>) working[i] = cpu::convert_value<W>(parameter);
  }
}

void check_same_shape(const TensorView& a, const TensorView& b, const char* what) {
  HPCTRAIN_ASSERT(a.rows == b.rows && a.cols == b.cols && a.dtype == b.dtype,
                  what << ": shapes/dtypes differ: " << a.rows << "x" << a.cols << " " << dtype_name(a.dtype) << " vs "
                       << b.rows << "x" << b.cols << " " << dtype_name(b.dtype));
}

// The cross-entropy kernels' arguments: dlogits (when given) of the logits' shape, classes, labels in [0, cols).
void check_cross_entropy_arguments(const TensorView& logits, const std::int32_t* labels, const TensorView& dlogits) {
  if (dlogits.data != nullptr) check_same_shape(logits, dlogits, "softmax_cross_entropy");
  const std::int64_t rows = logits.rows, cols = logits.cols;
  HPCTRAIN_ASSERT(cols > 0 || rows == 0, "softmax_cross_entropy: no classes");
  // The labels are this rank's batch: only it sees a bad one, so only it reports (naming itself) and MPI_Abort
  // ends the others at once; an error scoped to every rank would wait for ranks that never arrive.
  for (std::int64_t i = 0; i < rows; ++i)
    HPCTRAIN_VERIFY((labels[i] >= 0 && labels[i] < cols) || labels[i] == km::ignored_label, InputError,
                    "label " << labels[i] << " of batch row " << i << " is outside [0, " << cols << ")",
                    "labels are checked when the data is opened, so the data file changed while hpctrain ran: "
                    "restore it and run again (training: --resume auto)",
                    ErrorScope::this_rank);
}

// The master dtype that goes with a storage dtype: f64 for f64 (gradient checks), f32 otherwise.
DType master_of(DType storage) { return storage == DType::f64 ? DType::f64 : DType::f32; }

// out[j] (+)= sum over rows of value(i, j): threads own blocks of columns and add rows in order (deterministic).
// Out is the master type (float or double), C the type the sums are formed in.
template <class C, class Out, class Value>
void column_sums(std::int64_t rows, std::int64_t cols, Out* out, bool accumulate, Value value) {
  const std::int64_t blocks = (cols + column_block - 1) / column_block;
#pragma omp parallel for schedule(static) if (rows * cols > parallel_threshold)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t begin = block * column_block;
    const std::int64_t end = std::min(cols, begin + column_block);
    C sums[column_block] = {};
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = begin; j < end; ++j) sums[j - begin] += value(i, j);
    for (std::int64_t j = begin; j < end; ++j)
      out[j] = accumulate ? out[j] + static_cast<Out>(sums[j - begin]) : static_cast<Out>(sums[j - begin]);
  }
}

// y[i] = f(x[i]) element-wise in the compute type; y may alias x.
template <class T, class F>
void map_elements(const T* x, T* y, std::int64_t count, F f) {
#pragma omp parallel for schedule(static) if (count > parallel_threshold)
  for (std::int64_t i = 0; i < count; ++i) y[i] = store<T>(f(load(x[i])));
}

// dx[i] = f'(x[i]) * dy[i]; dx may alias dy.
template <class T, class F>
void map_derivative(const T* x, const T* dy, T* dx, std::int64_t count, F derivative) {
#pragma omp parallel for schedule(static) if (count > parallel_threshold)
  for (std::int64_t i = 0; i < count; ++i) dx[i] = store<T>(derivative(load(x[i])) * load(dy[i]));
}

// Calls f with a functor for the value (or derivative) of the activation: the switch happens once, not per element.
template <class C, class F>
void with_activation(Activation kind, C alpha, bool derivative, F f) {
  switch (kind) {
    case Activation::relu:
      return derivative ? f([](C x) { return km::relu_derivative(x); }) : f([](C x) { return km::relu(x); });
    case Activation::gelu:
      return derivative ? f([](C x) { return km::gelu_derivative(x); }) : f([](C x) { return km::gelu(x); });
    case Activation::gelu_tanh:
      return derivative ? f([](C x) { return km::gelu_tanh_derivative(x); }) : f([](C x) { return km::gelu_tanh(x); });
    case Activation::tanh:
      return derivative ? f([](C x) { return km::tanh_derivative(x); }) : f([](C x) { return km::tanh_activation(x); });
    case Activation::leaky_relu:
      return derivative ? f([alpha](C x) { return km::leaky_relu_derivative(x, alpha); })
                        : f([alpha](C x) { return km::leaky_relu(x, alpha); });
  }
  HPCTRAIN_ASSERT(false, "unknown activation " << static_cast<int>(kind));
}

// out = in * mask / (1 - p) with the mask regenerated from (seed, step, layer, global element index): the forward and
// the backward of dropout are the same operation. The bits come 64 elements (16 Philox groups of four) per vectorised
// call (cpu_philox.hpp), the same numbers as kernels/math.hpp's scalar dropout_uniform gives each element.
template <class T>
void apply_dropout(float p, std::uint64_t seed, std::uint32_t step, std::uint32_t layer, const std::int64_t* sample_ids,
                   const T* in, T* out, std::int64_t rows, std::int64_t cols) {
  using C = compute_t<T>;
  const std::uint64_t key = km::dropout_key(seed, step);
  const C scale = km::dropout_scale<C>(p);
#pragma omp parallel for schedule(static) if (rows * cols > parallel_threshold)
  for (std::int64_t row = 0; row < rows; ++row) {
    alignas(64) std::uint32_t words[64];
    const std::uint64_t first = static_cast<std::uint64_t>(sample_ids[row]) * static_cast<std::uint64_t>(cols);
    const T* row_in = in + row * cols;
    T* row_out = out + row * cols;
    for (std::int64_t col = 0; col < cols;) {
      // Elements first + col .. : their groups start at (first + col) / 4, the first element at lane (first + col) % 4.
      const std::uint64_t element = first + static_cast<std::uint64_t>(col);
      cpu::philox_words16(key, layer, RngPurpose::dropout, element >> 2, words);
      const auto offset = static_cast<std::int64_t>(element & 3u);
      const std::int64_t count = std::min<std::int64_t>(64 - offset, cols - col);
      const std::uint32_t* bits = words + offset;
      for (std::int64_t j = 0; j < count; ++j) {
        const bool keep = uniform_from_bits(bits[j]) >= p;
        row_out[col + j] = store<T>(load(row_in[col + j]) * (keep ? scale : C(0)));
      }
      col += count;
    }
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(SpatialLayout preferred) : preferred_layout_(preferred) {}
  [[nodiscard]] std::string name() const override { return "cpu"; }
  [[nodiscard]] bool memory_is_host() const override { return true; }
  [[nodiscard]] bool has_spatial_operations() const override { return true; }
  [[nodiscard]] std::string precision_note(DType storage) const override {
    if (storage == DType::f16)
      return "precision fp16: the CPU backend widens fp16 to fp32 for every matrix product and convolution, so fp16 "
             "runs slower than fp32 here; fp16 is meant for GPUs, bf16 or fp32 for CPUs";
    if (storage == DType::bf16 && !cpu::onednn_runs_bf16())
      return "precision bf16: oneDNN has no bf16 kernel for this CPU (it needs AVX-512), so matrix products and "
             "convolutions run in fp32 on widened copies: bf16 halves the activations' memory but is no faster than "
             "fp32 here";
    return {};
  }

  // ---- memory: plain host memory ----
  void* allocate(std::size_t bytes) override { return cpu::aligned_allocate(bytes); }
  void deallocate(void* pointer) override { std::free(pointer); }
  void copy_to_backend(void* destination, const void* host_source, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(destination, host_source, bytes);
  }
  void copy_to_host(void* host_destination, const void* source, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(host_destination, source, bytes);
  }
  void copy(void* destination, const void* source, std::size_t bytes) override {
    if (bytes > 0 && destination != source) std::memmove(destination, source, bytes);
  }
  void zero(void* pointer, std::size_t bytes) override {
    if (bytes > 0) std::memset(pointer, 0, bytes);
  }
  void synchronize() override {}

  // ---- conversions ----
  void cast(const TensorView& source, const TensorView& destination) override {
    HPCTRAIN_ASSERT(source.size() == destination.size(),
                    "cast: " << source.size() << " elements into " << destination.size());
    if (source.dtype == destination.dtype) {
      copy(destination.data, source.data, source.bytes());
      return;
    }
    const std::int64_t count = source.size();
    dispatch_dtype(source.dtype, [&]<class TS>() {
      dispatch_dtype(destination.dtype, [&]<class TD>() {
        const TS* in = static_cast<const TS*>(source.data);
        TD* out = static_cast<TD*>(destination.data);
#pragma omp parallel for schedule(static) if (count > parallel_threshold)
        for (std::int64_t i = 0; i < count; ++i) out[i] = cpu::convert_value<TD>(in[i]);
      });
    });
  }

  // ---- matrix products ----
  void gemm(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
            const void* bias, bool accumulate) override {
    gemm_.run(a, transpose_a, b, transpose_b, c, bias, accumulate);
  }
  // The residual add in the product: a binary add post-op (f32, bf16), or the pass that stores an fp32 result (f16,
  // and bf16 without oneDNN bf16 kernels), or the f64 loops. The sum is rounded once.
  [[nodiscard]] bool fuses_residual_add(DType) const override { return true; }
  void linear_residual_forward(const TensorView& x, const TensorView& weight, const void* bias, const TensorView& skip,
                               const TensorView& y) override {
    check_same_shape(skip, y, "linear_residual_forward");
    HPCTRAIN_ASSERT(skip.data != y.data, "linear_residual_forward: skip aliases y");
    gemm_.run(x, false, weight, true, y, bias, false, skip.data);
  }

  void bias_gradient(const TensorView& dy, void* dbias, DType master, bool accumulate) override {
    HPCTRAIN_ASSERT(master == master_of(dy.dtype),
                    "bias_gradient: master " << dtype_name(master) << " for " << dtype_name(dy.dtype) << " gradients");
    dispatch_dtype(dy.dtype, [&]<class T>() {
      using C = compute_t<T>;
      const T* gradient = static_cast<const T*>(dy.data);  // (rows, cols)
      const std::int64_t cols = dy.cols;
      column_sums<C>(dy.rows, cols, static_cast<C*>(dbias), accumulate,
                     [&](std::int64_t i, std::int64_t j) { return load(gradient[i * cols + j]); });
    });
  }

  // ---- element-wise ----
  void activation_forward(Activation kind, float alpha, const TensorView& x, const TensorView& y) override {
    check_same_shape(x, y, "activation_forward");
    dispatch_dtype(x.dtype, [&]<class T>() {
      using C = compute_t<T>;
      with_activation<C>(kind, static_cast<C>(alpha), false, [&](auto f) {
        map_elements(static_cast<const T*>(x.data), static_cast<T*>(y.data), x.size(), f);
      });
    });
  }

  void activation_backward(Activation kind, float alpha, const TensorView& x, const TensorView& dy,
                           const TensorView& dx) override {
    check_same_shape(x, dy, "activation_backward");
    check_same_shape(x, dx, "activation_backward");
    dispatch_dtype(x.dtype, [&]<class T>() {
      using C = compute_t<T>;
      with_activation<C>(kind, static_cast<C>(alpha), true, [&](auto derivative) {
        map_derivative(static_cast<const T*>(x.data), static_cast<const T*>(dy.data), static_cast<T*>(dx.data),
                       x.size(), derivative);
      });
    });
  }

  void add(const TensorView& a, const TensorView& b, const TensorView& sum) override {
    check_same_shape(a, b, "add");
    check_same_shape(a, sum, "add");
    dispatch_dtype(a.dtype, [&]<class T>() {
      const T* left = static_cast<const T*>(a.data);
      const T* right = static_cast<const T*>(b.data);
      T* out = static_cast<T*>(sum.data);
      const std::int64_t count = a.size();
#pragma omp parallel for schedule(static) if (count > parallel_threshold)
      for (std::int64_t i = 0; i < count; ++i) out[i] = store<T>(load(left[i]) + load(right[i]));
    });
  }

  void dropout_forward(float p, std::uint64_t seed, std::uint32_t step, std::uint32_t layer,
                       const std::int64_t* sample_ids, const TensorView& x, const TensorView& y) override {
    dropout(p, seed, step, layer, sample_ids, x, y, "dropout_forward");
  }
  void dropout_backward(float p, std::uint64_t seed, std::uint32_t step, std::uint32_t layer,
                        const std::int64_t* sample_ids, const TensorView& dy, const TensorView& dx) override {
    dropout(p, seed, step, layer, sample_ids, dy, dx, "dropout_backward");
  }

  // ---- normalisation ----
  void layernorm_forward(const TensorView& x, const void* gamma, const void* beta, float eps, const TensorView& y,
                         void* mean, void* rstd) override {
    check_same_shape(x, y, "layernorm_forward");
    HPCTRAIN_ASSERT(x.cols > 0, "layernorm_forward: no columns");
    dispatch_dtype(x.dtype, [&]<class T>() {
      using C = compute_t<T>;
      const T* in = static_cast<const T*>(x.data);    // (rows, cols)
      T* out = static_cast<T*>(y.data);               // (rows, cols)
      const C* scale = static_cast<const C*>(gamma);  // (cols)
      const C* shift = static_cast<const C*>(beta);   // (cols)
      C* row_mean = static_cast<C*>(mean);            // (rows)
      C* row_rstd = static_cast<C*>(rstd);            // (rows)
      const std::int64_t cols = x.cols;
#pragma omp parallel for schedule(static) if (x.size() > parallel_threshold)
      for (std::int64_t i = 0; i < x.rows; ++i)
        km::layernorm_forward_row(in + i * cols, cols, scale, shift, static_cast<C>(eps), out + i * cols, row_mean + i,
                                  row_rstd + i);
    });
  }

  void layernorm_backward(const TensorView& x, const TensorView& dy, const void* gamma, const void* mean,
                          const void* rstd, const TensorView& dx, void* dgamma, void* dbeta, bool accumulate) override {
    check_same_shape(x, dy, "layernorm_backward");
    check_same_shape(x, dx, "layernorm_backward");
    dispatch_dtype(x.dtype, [&]<class T>() {
      using C = compute_t<T>;
      const T* in = static_cast<const T*>(x.data);         // (rows, cols)
      const T* gradient = static_cast<const T*>(dy.data);  // (rows, cols)
      T* input_gradient = static_cast<T*>(dx.data);        // (rows, cols)
      const C* scale = static_cast<const C*>(gamma);       // (cols)
      const C* row_mean = static_cast<const C*>(mean);     // (rows)
      const C* row_rstd = static_cast<const C*>(rstd);     // (rows)
      const std::int64_t rows = x.rows, cols = x.cols;
      // Parameter gradients first: dx may alias dy.
      if (dgamma != nullptr)
        column_sums<C>(rows, cols, static_cast<C*>(dgamma), accumulate, [&](std::int64_t i, std::int64_t j) {
          return load(gradient[i * cols + j]) * ((load(in[i * cols + j]) - row_mean[i]) * row_rstd[i]);
        });
      if (dbeta != nullptr)
        column_sums<C>(rows, cols, static_cast<C*>(dbeta), accumulate,
                       [&](std::int64_t i, std::int64_t j) { return load(gradient[i * cols + j]); });
#pragma omp parallel for schedule(static) if (x.size() > parallel_threshold)
      for (std::int64_t i = 0; i < rows; ++i)
        km::layernorm_backward_row(in + i * cols, gradient + i * cols, cols, scale, row_mean[i], row_rstd[i],
                                   input_gradient + i * cols);
    });
  }

  // ---- convolutional networks: oneDNN convolutions (cpu_convolution.cpp), loops for pooling and groupnorm ----
  void convolution_forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& weight,
                           const void* bias, const TensorView& y) override {
    convolution_.forward(geometry, x, weight, bias, y);
  }
  void convolution_backward_data(const SpatialGeometry& geometry, const TensorView& dy, const TensorView& weight,
                                 const TensorView& dx) override {
    convolution_.backward_data(geometry, dy, weight, dx);
  }
  void convolution_backward_weights(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                                    const TensorView& dweight, void* dbias, bool accumulate) override {
    convolution_.backward_weights(geometry, x, dy, dweight, dbias, accumulate);
  }
  void pooling_forward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x,
                       const TensorView& y) override {
    cpu::pooling_forward(kind, geometry, x, y);
  }
  void pooling_backward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                        const TensorView& dx) override {
    cpu::pooling_backward(kind, geometry, x, dy, dx);
  }
  void max_pooling_forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& y,
                           std::int32_t* argmax) override {
    cpu::max_pooling_forward(geometry, x, y, argmax);
  }
  void max_pooling_backward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                            const std::int32_t* argmax, const TensorView& dx) override {
    cpu::max_pooling_backward(geometry, x, dy, argmax, dx);
  }
  void groupnorm_forward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                         const void* gamma, const void* beta, float eps, const TensorView& y, void* mean,
                         void* rstd) override {
    cpu::groupnorm_forward(channels, groups, layout, x, gamma, beta, eps, y, mean, rstd);
  }
  void groupnorm_backward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                          const TensorView& dy, const void* gamma, const void* mean, const void* rstd,
                          const TensorView& dx, void* dgamma, void* dbeta, bool accumulate) override {
    cpu::groupnorm_backward(channels, groups, layout, x, dy, gamma, mean, rstd, dx, dgamma, dbeta, accumulate);
  }
  // oneDNN's convolutions read channels-last activations directly at their best speed (and channels-first ones only
  // through a reorder per call, or its slower gemm-based kernels).
  [[nodiscard]] SpatialLayout preferred_spatial_layout(DType /*activations*/) const override {
    return preferred_layout_;
  }
  void convert_spatial_layout(std::int64_t channels, SpatialLayout from, const TensorView& x,
                              const TensorView& y) override {
    cpu::convert_layout(channels, from, x, y);
  }

  // ---- sequences: fused attention, embedding, pooling (cpu_attention.cpp, cpu_embedding.cpp, cpu_sequence_pool.cpp)
  // ----
  void attention_forward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out,
                         void* lse) override {
    attention_.forward(geometry, qkv, out, lse);
  }
  void attention_backward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out,
                          const TensorView& dout, const void* lse, const TensorView& dqkv) override {
    attention_.backward(geometry, qkv, out, dout, lse, dqkv);
  }
  void cached_attention(const AttentionGeometry& geometry, const TensorView& qkv, void* cache, std::int64_t first,
                        const TensorView& out) override {
    cpu::cached_attention(geometry, qkv, cache, first, out);
  }
  void embedding_forward(const std::int32_t* ids, const void* table, std::int64_t vocabulary, const TensorView& y,
                         const void* positions, std::int64_t sequence) override {
    embedding_.forward(ids, table, vocabulary, y, positions, sequence);
  }
  void embedding_backward(const std::int32_t* ids, const TensorView& dy, std::int64_t vocabulary, void* dtable,
                          bool accumulate) override {
    embedding_.backward(ids, dy, vocabulary, dtable, accumulate);
  }
  void sequence_pool_forward(SequencePooling mode, std::int64_t sequence, const TensorView& x,
                             const TensorView& y) override {
    cpu::sequence_pool_forward(mode, sequence, x, y);
  }
  void sequence_pool_backward(SequencePooling mode, std::int64_t sequence, const TensorView& dy,
                              const TensorView& dx) override {
    cpu::sequence_pool_backward(mode, sequence, dy, dx);
  }
  void to_sequence_forward(std::int64_t channels, SpatialLayout layout, const TensorView& x, const void* class_token,
                           const void* positions, const TensorView& y) override {
    cpu::to_sequence_forward(channels, layout, x, class_token, positions, y);
  }
  void to_sequence_backward(std::int64_t channels, SpatialLayout layout, const TensorView& dy, const TensorView& dx,
                            void* dclass_token, void* dpositions, bool accumulate) override {
    cpu::to_sequence_backward(channels, layout, dy, dx, dclass_token, dpositions, accumulate);
  }

  // ---- losses ----
  void softmax_cross_entropy(const TensorView& logits, const std::int32_t* labels, const float* grad_scale,
                             const TensorView& dlogits, LossSums* sums) override {
    const std::int64_t cols = logits.cols;
    cross_entropy_rows(logits, labels, grad_scale, dlogits, sums,
                       [cols](const auto* in, std::int32_t label, auto scale, auto* out, auto* loss, bool* correct) {
                         km::softmax_cross_entropy_row(in, cols, label, scale, out, loss, correct);
                       });
  }

  void smoothed_softmax_cross_entropy(const TensorView& logits, const std::int32_t* labels,
                                      const CrossEntropyOptions& options, const float* grad_scale,
                                      const TensorView& dlogits, LossSums* sums) override {
    const std::int64_t cols = logits.cols;
    cross_entropy_rows(
        logits, labels, grad_scale, dlogits, sums,
        [cols, &options](const auto* in, std::int32_t label, auto scale, auto* out, auto* loss, bool* correct) {
          const auto smoothing = static_cast<decltype(scale)>(options.label_smoothing);
          km::smoothed_softmax_cross_entropy_row(in, cols, label, options.class_weights, smoothing, scale, out, loss,
                                                 correct);
        });
  }

  void count_class_hits(const TensorView& scores, const std::int32_t* targets, double* counts,
                        bool accumulate) override {
    cpu::count_class_hits(scores, targets, counts, accumulate);
  }
  void score_targets(const TensorView& logits, const std::int32_t* targets, std::int32_t* argmax,
                     float* target_log_probability) override {
    cpu::score_targets(logits, targets, argmax, target_log_probability);
  }
  void mean_squared_error(const TensorView& pred, const void* targets, const float* grad_scale, const TensorView& dpred,
                          LossSums* sums) override {
    const bool with_gradient = dpred.data != nullptr;
    if (with_gradient) check_same_shape(pred, dpred, "mean_squared_error");
    const std::int64_t rows = pred.rows, cols = pred.cols;
    HPCTRAIN_ASSERT(cols > 0 || rows == 0, "mean_squared_error: no columns");
    double* row_results = row_results_.reserve_elements<double>(static_cast<std::size_t>(2 * rows));  // (rows, 2)
    dispatch_dtype(pred.dtype, [&]<class T>() {
      using C = compute_t<T>;
      const T* in = static_cast<const T*>(pred.data);    // (rows, cols)
      const C* target = static_cast<const C*>(targets);  // (rows, cols), master dtype
      T* out = static_cast<T*>(dpred.data);              // (rows, cols) or null
      const C scale = with_gradient ? static_cast<C>(*grad_scale) : C(0);
#pragma omp parallel for schedule(static) if (rows * cols > parallel_threshold)
      for (std::int64_t i = 0; i < rows; ++i) {
        const C loss = km::mean_squared_error_row(in + i * cols, target + i * cols, cols, scale,
                                                  with_gradient ? out + i * cols : nullptr);
        row_results[2 * i] = static_cast<double>(loss);
        row_results[2 * i + 1] = 0.0;
      }
    });
    add_row_results(row_results, rows, false, sums);
  }

  // ---- optimizer ----
  void gradient_statistics(const float* gradients, std::int64_t count, const OptimizerHyper& hyper,
                           StepScalars* scalars) override {
    const std::int64_t chunks = (count + cpu::statistics_chunk - 1) / cpu::statistics_chunk;
    double* partials = partial_sums_.reserve_elements<double>(static_cast<std::size_t>(2 * chunks));  // (2, chunks)
    const ElementRange whole{0, count};
    gradient_chunk_statistics(gradients, count, {&whole, 1}, partials);
    statistics_from_chunks(partials, chunks, hyper, scalars);
  }

  void gradient_chunk_statistics(const float* gradients, std::int64_t count, std::span<const ElementRange> owned,
                                 double* partials) override {
    const std::int64_t chunks = (count + cpu::statistics_chunk - 1) / cpu::statistics_chunk;
    for (const ElementRange& range : owned) {
      HPCTRAIN_ASSERT(range.begin % cpu::statistics_chunk == 0 && range.begin <= range.end && range.end <= count &&
                          (range.end % cpu::statistics_chunk == 0 || range.end == count),
                      "gradient statistics of elements [" << range.begin << ", " << range.end
                                                          << "): not whole chunks of " << cpu::statistics_chunk);
      const std::int64_t first = range.begin / cpu::statistics_chunk;
      const std::int64_t last = (range.end + cpu::statistics_chunk - 1) / cpu::statistics_chunk;
#pragma omp parallel for schedule(static) if (range.size() > parallel_threshold)
      for (std::int64_t chunk = first; chunk < last; ++chunk) {
        const std::int64_t begin = chunk * cpu::statistics_chunk;
        const std::int64_t end = std::min(count, begin + cpu::statistics_chunk);
        int nonfinite = 0;
        partials[chunk] = cpu::chunk_sum_of_squares(gradients, begin, end, nonfinite);
        partials[chunks + chunk] = nonfinite != 0 ? 1.0 : 0.0;
      }
    }
  }

  void statistics_from_chunks(const double* partials, std::int64_t chunks, const OptimizerHyper& hyper,
                              StepScalars* scalars) override {
    double sum_of_squares = 0.0;
    bool any_nonfinite = false;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {  // in order: deterministic
      sum_of_squares += partials[chunk];
      any_nonfinite |= partials[chunks + chunk] != 0.0;
    }
    const double norm = std::sqrt(sum_of_squares) / static_cast<double>(scalars->loss_scale);
    scalars->found_nonfinite = any_nonfinite ? 1 : 0;
    scalars->grad_norm = static_cast<float>(norm);
    scalars->clip_coefficient =
        any_nonfinite ? 1.0f : km::clip_coefficient(static_cast<float>(norm), hyper.max_grad_norm);
  }

  void optimizer_step(const OptimizerHyper& hyper, bool decay, float* parameters, const float* gradients, float* state1,
                      float* state2, std::int64_t count, const TensorView& working,
                      const StepScalars* scalars) override {
    if (scalars->found_nonfinite) return;
    if (working.data != nullptr)
      HPCTRAIN_ASSERT(working.size() == count,
                      "optimizer_step: working copy of " << working.size() << " elements for " << count);
    const float inverse_loss_scale = 1.0f / scalars->loss_scale;
    const float clip = scalars->clip_coefficient;
    const float learning_rate = scalars->learning_rate;
    const float weight_decay = decay ? hyper.weight_decay : 0.0f;
    // The working copy's dtype is dispatched outside the loop; void means "no working copy".
    const auto run = [&]<class W>(W* copy) {
      if (hyper.type == OptimizerType::adamw) {
        HPCTRAIN_ASSERT(state1 != nullptr && state2 != nullptr, "AdamW needs both moment buffers");
        const auto constants = km::adamw_constants(learning_rate, hyper.beta1, hyper.beta2, hyper.eps, weight_decay,
                                                   scalars->applied_steps + 1);
        adamw_range(parameters, state1, state2, gradients, copy, count, inverse_loss_scale, clip, constants);
      } else {
        HPCTRAIN_ASSERT(hyper.momentum == 0.0f || state1 != nullptr, "SGD with momentum needs a momentum buffer");
        sgd_range(parameters, hyper.momentum != 0.0f ? state1 : nullptr, gradients, copy, count, inverse_loss_scale,
                  clip, learning_rate, hyper, weight_decay, scalars->applied_steps == 0);
      }
    };
    if (working.data == nullptr) {
      run.template operator()<void>(nullptr);
    } else {
      dispatch_dtype(working.dtype, [&]<class W>() { run.template operator()<W>(static_cast<W*>(working.data)); });
    }
  }

  void finish_step(const LossScalerConfig& config, StepScalars* scalars) override {
    km::update_loss_scale(config, *scalars);
  }

  void loss_gradient_scale(const StepScalars* scalars, float rows, const float* label_weights,
                           float* grad_scale) override {
    *grad_scale = scalars->loss_scale / (label_weights != nullptr ? *label_weights : rows);
  }

  // ---- uploads and step bookkeeping: backend memory is host memory ----
  void upload_cast(const float* host_source, const TensorView& destination) override {
    cast({const_cast<float*>(host_source), DType::f32, destination.rows, destination.cols}, destination);
  }
  void copy_to_slot(void* base, std::size_t stride, const std::int32_t* slot, const void* source,
                    std::size_t bytes) override {
    copy(static_cast<char*>(base) + static_cast<std::size_t>(*slot) * stride, source, bytes);
  }
  void copy_from_slot(void* destination, const void* base, std::size_t stride, const std::int32_t* slot,
                      std::size_t bytes) override {
    copy(destination, static_cast<const char*>(base) + static_cast<std::size_t>(*slot) * stride, bytes);
  }
  void advance_slot(std::int32_t* slot) override { ++*slot; }

 private:
  void dropout(float p, std::uint64_t seed, std::uint32_t step, std::uint32_t layer, const std::int64_t* sample_ids,
               const TensorView& in, const TensorView& out, const char* what) {
    check_same_shape(in, out, what);
    HPCTRAIN_ASSERT(p >= 0.0f && p <= 1.0f, what << ": probability " << p << " outside [0, 1]");
    if (p == 0.0f) {  // identity
      copy(out.data, in.data, in.bytes());
      return;
    }
    dispatch_dtype(in.dtype, [&]<class T>() {
      apply_dropout(p, seed, step, layer, sample_ids, static_cast<const T*>(in.data), static_cast<T*>(out.data),
                    in.rows, in.cols);
    });
  }

  // sums += (sum of the per-row losses, sum of the per-row correct flags), added in row order (deterministic).
  // The cross-entropy kernels' frame: the arguments checked, row(logits row, label, gradient scale, dlogits row or
  // null, &loss, &correct) for every row (in parallel, in the compute type), the per-row results summed in order.
  template <class Row>
  void cross_entropy_rows(const TensorView& logits, const std::int32_t* labels, const float* grad_scale,
                          const TensorView& dlogits, LossSums* sums, const Row& row) {
    const bool with_gradient = dlogits.data != nullptr;
    check_cross_entropy_arguments(logits, labels, dlogits);
    const std::int64_t rows = logits.rows, cols = logits.cols;
    double* row_results = row_results_.reserve_elements<double>(static_cast<std::size_t>(2 * rows));  // (rows, 2)
    dispatch_dtype(logits.dtype, [&]<class T>() {
      using C = compute_t<T>;
      const T* in = static_cast<const T*>(logits.data);  // (rows, cols)
      T* out = static_cast<T*>(dlogits.data);            // (rows, cols) or null
      const C scale = with_gradient ? static_cast<C>(*grad_scale) : C(0);
#pragma omp parallel for schedule(static) if (rows * cols > parallel_threshold)
      for (std::int64_t i = 0; i < rows; ++i) {
        C loss{};
        bool correct = false;
        row(in + i * cols, labels[i], scale, with_gradient ? out + i * cols : nullptr, &loss, &correct);
        row_results[2 * i] = static_cast<double>(loss);
        row_results[2 * i + 1] = correct ? 1.0 : 0.0;
      }
    });
    add_row_results(row_results, rows, true, sums);
  }

  static void add_row_results(const double* row_results, std::int64_t rows, bool count_correct, LossSums* sums) {
    if (sums == nullptr) return;
    double loss = 0.0, correct = 0.0;
    for (std::int64_t i = 0; i < rows; ++i) {
      loss += row_results[2 * i];
      correct += row_results[2 * i + 1];
    }
    sums->loss_sum += loss;
    if (count_correct) sums->correct += correct;
  }

  cpu::CpuGemm gemm_;
  cpu::CpuConvolution convolution_;
  cpu::CpuAttention attention_;
  cpu::CpuEmbedding embedding_;
  SpatialLayout preferred_layout_;
  cpu::ScratchBuffer row_results_;   // (rows, 2) per-row loss and correct flag
  cpu::ScratchBuffer partial_sums_;  // (2, chunks) gradient statistics: sums of squares, non-finite flags
};

// Flush subnormal floats to zero (FTZ) and read them as zero (DAZ) in the calling thread's floating-point control.
void flush_subnormals_to_zero() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(_mm_getcsr() | 0x8040u);  // MXCSR bit 15: FTZ, bit 6: DAZ
#elif defined(__aarch64__)
  std::uint64_t control = 0;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(control));
  control |= std::uint64_t{1} << 24;  // FPCR.FZ: subnormal inputs and results of single/double operations are zero
  __asm__ __volatile__("msr fpcr, %0" : : "r"(control));
#endif  // elsewhere subnormals stay (slower on some cores, same results to far below any update's size)
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(SpatialLayout preferred) {
  // On every OpenMP thread: once a loss gets close to zero the gradients turn subnormal, and x86 cores then run ~10x
  // slower (measured with bench/run.sh). GPUs flush in most kernels too; values this small do not change an update.
  // The 16-bit conversions are bit manipulations and unaffected.
#pragma omp parallel
  flush_subnormals_to_zero();
  flush_subnormals_to_zero();
  return std::make_unique<CpuBackend>(preferred);
}

std::unique_ptr<Backend> make_cpu_backend() {
  const char* value = std::getenv("HPCTRAIN_SPATIAL_LAYOUT");
  const std::string layout = value != nullptr ? value : "channels_last";
  HPCTRAIN_VERIFY(layout == "channels_last" || layout == "channels_first", InputError,
                  "HPCTRAIN_SPATIAL_LAYOUT=" << layout << " is not a layout",
                  "set it to channels_last (the default) or channels_first, or unset it");
  return make_cpu_backend(layout == "channels_last" ? SpatialLayout::channels_last : SpatialLayout::channels_first);
}

}  // namespace hpctrain
