// The CUDA backend: device memory on one stream, cuBLASLt for matrix products (cuda_gemm.cpp), cuDNN for
// convolutions (cuda_convolution.cu), own kernels for pooling and groupnorm (cuda_spatial.cu) and everything else. The
// kernels are thin loops over threads around the HPCTRAIN_HD arithmetic of kernels/math.hpp, so they compute the CPU
// backend's formulas (tests/gpu/cuda_kernels_test.cpp compares the two on the same inputs).
//
// - Storage f32/bf16/f16 with fp32 arithmetic; f64 (CPU gradient checks only) is NotSupported.
// - Element-wise kernels move 16 bytes per thread and access when every pointer is 16-byte aligned.
// - Rows (layernorm, losses) get one warp each; column sums (bias and layernorm parameter gradients) one thread per
//   column and row slice, added in a fixed order. Every reduction has a fixed order: results are deterministic.
// - Scalars that change per step (loss scale, learning rate, skip flag, gradient scale) are read by the kernels from
//   device memory, so a step needs no host synchronisation and can be captured in a CUDA graph.
// - Memory is allocated at set-up: the backend's own scratch (gemm workspace, bias and reduction scratch) is sized at
//   construction and grows only if a first call needs more (during warm-up, before any graph capture).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "cuda_dispatch.hpp"
#include "cuda_gemm.hpp"
#include "cuda_spatial.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda/cuda_backend.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/math.hpp"

namespace hpctrain {
namespace {

namespace km = kernel_math;
using cuda::dispatch_storage;

constexpr int block_threads = 256;
constexpr int warp_threads = 32;
constexpr std::int64_t max_blocks = 8192;  // grid-stride loops beyond this
// Elements per partial sum of the gradient statistics (one block each); partials are added in order.
constexpr std::int64_t statistics_chunk = 4096;
// Rows per thread slice in column sums: blockDim = (32 columns, column_sum_slices row slices).
constexpr int column_sum_slices = 8;

unsigned grid_for(std::int64_t work_items, std::int64_t per_block = block_threads) {
  const std::int64_t blocks = (work_items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, max_blocks));
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

void check_same_shape(const TensorView& a, const TensorView& b, const char* what) {
  HPCTRAIN_ASSERT(a.rows == b.rows && a.cols == b.cols && a.dtype == b.dtype,
                  what << ": shapes/dtypes differ: " << a.rows << "x" << a.cols << " " << dtype_name(a.dtype) << " vs "
                       << b.rows << "x" << b.cols << " " << dtype_name(b.dtype));
}

// ---- device helpers ----
__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_threads() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = warp_threads / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// N elements of T moved as one access (16 bytes for N = 16 / sizeof(T)).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <class T>
constexpr int pack_width = static_cast<int>(16 / sizeof(T));

template <class TD, class TS>
__device__ __forceinline__ TD convert(TS value) {
  if constexpr (std::is_same_v<TD, TS>) {
    return value;
  } else {
    return store<TD>(load(value));
  }
}

// ---- element-wise: out[i] = op(in0[i], in1[i]) (in1 may be null: op gets in0[i] twice) ----
// out may alias in0 or in1: a thread reads its elements before it writes them.
template <class TIn, class TOut, class Op>
__global__ void map_kernel(const TIn* in0, const TIn* in1, TOut* out, std::int64_t count, bool vectorized, Op op) {
  constexpr int N = pack_width<TIn>;
  const std::int64_t packs = (count + N - 1) / N;
  for (std::int64_t p = global_thread(); p < packs; p += grid_threads()) {
    const std::int64_t first = p * N;
    if (vectorized && first + N <= count) {
      const Pack<TIn, N> a = *reinterpret_cast<const Pack<TIn, N>*>(in0 + first);
      const Pack<TIn, N> b = in1 != nullptr ? *reinterpret_cast<const Pack<TIn, N>*>(in1 + first) : a;
      Pack<TOut, N> result;
#pragma unroll
      for (int j = 0; j < N; ++j) result.v[j] = op(a.v[j], b.v[j]);
      *reinterpret_cast<Pack<TOut, N>*>(out + first) = result;
    } else {
      for (std::int64_t i = first; i < first + N && i < count; ++i)
        out[i] = op(in0[i], in1 != nullptr ? in1[i] : in0[i]);
    }
  }
}

template <class TIn, class TOut, class Op>
void launch_map(cudaStream_t stream, const TIn* in0, const TIn* in1, TOut* out, std::int64_t count, Op op) {
  if (count == 0) return;
  // Packs of TOut are N * sizeof(TOut) bytes: aligned when the address is a multiple of that.
  constexpr int N = pack_width<TIn>;
  const bool vectorized = aligned16(in0) && (in1 == nullptr || aligned16(in1)) &&
                          reinterpret_cast<std::uintptr_t>(out) % (N * sizeof(TOut)) == 0;
  map_kernel<<<grid_for((count + N - 1) / N), block_threads, 0, stream>>>(in0, in1, out, count, vectorized, op);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

template <class TS, class TD>
struct CastOp {
  __device__ TD operator()(TS value, TS) const { return convert<TD>(value); }
};

template <class T, Activation kind>
__device__ __forceinline__ float activation_value(float x, float alpha) {
  if constexpr (kind == Activation::relu) return km::relu(x);
  if constexpr (kind == Activation::gelu) return km::gelu(x);
  if constexpr (kind == Activation::tanh) return km::tanh_activation(x);
  if constexpr (kind == Activation::leaky_relu) return km::leaky_relu(x, alpha);
}
template <class T, Activation kind>
__device__ __forceinline__ float activation_derivative(float x, float alpha) {
  if constexpr (kind == Activation::relu) return km::relu_derivative(x);
  if constexpr (kind == Activation::gelu) return km::gelu_derivative(x);
  if constexpr (kind == Activation::tanh) return km::tanh_derivative(x);
  if constexpr (kind == Activation::leaky_relu) return km::leaky_relu_derivative(x, alpha);
}

template <class T, Activation kind>
struct ActivationForwardOp {
  float alpha;
  __device__ T operator()(T x, T) const { return store<T>(activation_value<T, kind>(load(x), alpha)); }
};
// dx = f'(x) * dy, in the CPU backend's order.
template <class T, Activation kind>
struct ActivationBackwardOp {
  float alpha;
  __device__ T operator()(T x, T dy) const {
    return store<T>(activation_derivative<T, kind>(load(x), alpha) * load(dy));
  }
};

template <template <class, Activation> class Op, class T>
void launch_activation(cudaStream_t stream, Activation kind, float alpha, const T* x, const T* dy, T* out,
                       std::int64_t count) {
  switch (kind) {
    case Activation::relu:
      return launch_map(stream, x, dy, out, count, Op<T, Activation::relu>{alpha});
    case Activation::gelu:
      return launch_map(stream, x, dy, out, count, Op<T, Activation::gelu>{alpha});
    case Activation::tanh:
      return launch_map(stream, x, dy, out, count, Op<T, Activation::tanh>{alpha});
    case Activation::leaky_relu:
      return launch_map(stream, x, dy, out, count, Op<T, Activation::leaky_relu>{alpha});
  }
  HPCTRAIN_ASSERT(false, "unknown activation " << static_cast<int>(kind));
}

// ---- dropout: the CPU backend's mask, element by element from its global index ----
template <class T>
__global__ void dropout_kernel(float p, std::uint64_t key, std::uint32_t layer, const std::int64_t* sample_ids,
                               const T* in, T* out, std::int64_t rows, std::int64_t cols) {
  const float scale = km::dropout_scale<float>(p);
  const std::int64_t count = rows * cols;
  for (std::int64_t index = global_thread(); index < count; index += grid_threads()) {
    const std::int64_t row = index / cols, col = index - row * cols;
    const std::uint64_t element = static_cast<std::uint64_t>(sample_ids[row]) * static_cast<std::uint64_t>(cols) +
                                  static_cast<std::uint64_t>(col);
    const bool keep = km::dropout_uniform(key, layer, element) >= p;
    out[index] = store<T>(load(in[index]) * (keep ? scale : 0.0f));
  }
}

// ---- rows: one warp per row ----
template <class T>
__global__ void layernorm_forward_kernel(const T* x, const float* gamma, const float* beta, float eps, T* y,
                                         float* mean_out, float* rstd_out, std::int64_t rows, std::int64_t cols) {
  const std::int64_t row = global_thread() / warp_threads;
  const int lane = static_cast<int>(threadIdx.x % warp_threads);
  if (row >= rows) return;       // whole warps leave together
  const T* in = x + row * cols;  // (cols)
  T* out = y + row * cols;       // (cols), may alias in
  float sum = 0.0f;
  for (std::int64_t j = lane; j < cols; j += warp_threads) sum += load(in[j]);
  const float mean = warp_sum(sum) / static_cast<float>(cols);
  float squares = 0.0f;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float centred = load(in[j]) - mean;
    squares += centred * centred;
  }
  const float rstd = 1.0f / km::square_root(warp_sum(squares) / static_cast<float>(cols) + eps);
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float normalised = (load(in[j]) - mean) * rstd;
    const float scaled = gamma != nullptr ? normalised * gamma[j] : normalised;
    out[j] = store<T>(beta != nullptr ? scaled + beta[j] : scaled);
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma; dx may alias dy.
template <class T>
__global__ void layernorm_backward_kernel(const T* x, const T* dy, const float* gamma, const float* mean,
                                          const float* rstd, T* dx, std::int64_t rows, std::int64_t cols) {
  const std::int64_t row = global_thread() / warp_threads;
  const int lane = static_cast<int>(threadIdx.x % warp_threads);
  if (row >= rows) return;
  const T* in = x + row * cols;
  const T* gradient = dy + row * cols;
  T* out = dx + row * cols;
  const float row_mean = mean[row], row_rstd = rstd[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float xhat = (load(in[j]) - row_mean) * row_rstd;
    const float g = gamma != nullptr ? load(gradient[j]) * gamma[j] : load(gradient[j]);
    sum_g += g;
    sum_g_xhat += g * xhat;
  }
  const float mean_g = warp_sum(sum_g) / static_cast<float>(cols);
  const float mean_g_xhat = warp_sum(sum_g_xhat) / static_cast<float>(cols);
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float xhat = (load(in[j]) - row_mean) * row_rstd;
    const float g = gamma != nullptr ? load(gradient[j]) * gamma[j] : load(gradient[j]);
    out[j] = store<T>(row_rstd * (g - mean_g - xhat * mean_g_xhat));
  }
}

// Per row: (loss, correct) into row_results (rows, 2). An out-of-range label gives a NaN loss (the CPU backend throws
// InputError; the trainer validates labels when it reads the data, so this only guards against corrupted memory).
template <class T>
__global__ void softmax_cross_entropy_kernel(const T* logits, const std::int32_t* labels, const float* grad_scale,
                                             T* dlogits, double* row_results, std::int64_t rows, std::int64_t cols) {
  const std::int64_t row = global_thread() / warp_threads;
  const int lane = static_cast<int>(threadIdx.x % warp_threads);
  if (row >= rows) return;
  const T* in = logits + row * cols;
  // Maximum and its first index (ties -> lowest index, as the CPU backend).
  float max_value = -std::numeric_limits<float>::infinity();
  std::int64_t argmax = cols;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float value = load(in[j]);
    if (argmax == cols || value > max_value) {  // this lane's first element, then strictly greater only
      max_value = value;
      argmax = j;
    }
  }
  for (int offset = warp_threads / 2; offset > 0; offset /= 2) {
    const float other_value = __shfl_xor_sync(0xffffffffu, max_value, offset);
    const std::int64_t other_index = __shfl_xor_sync(0xffffffffu, argmax, offset);
    if (other_value > max_value || (other_value == max_value && other_index < argmax)) {
      max_value = other_value;
      argmax = other_index;
    }
  }
  const std::int32_t label = labels[row];
  const bool valid = label >= 0 && label < cols;
  // Read before any lane writes the gradient over the logits (the shuffles below order every lane's reads first).
  const float label_logit = valid ? load(in[label]) : std::numeric_limits<float>::quiet_NaN();
  float sum = 0.0f;
  for (std::int64_t j = lane; j < cols; j += warp_threads) sum += km::exponential(load(in[j]) - max_value);
  sum = warp_sum(sum);
  if (lane == 0) {
    const float loss = km::natural_log(sum) - (label_logit - max_value);
    row_results[2 * row] = static_cast<double>(loss);
    row_results[2 * row + 1] = valid && argmax == label ? 1.0 : 0.0;
  }
  if (dlogits == nullptr) return;
  const float scale = *grad_scale;
  const float inverse_sum = 1.0f / sum;
  T* out = dlogits + row * cols;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    float probability = km::exponential(load(in[j]) - max_value) * inverse_sum;
    if (j == label) probability -= 1.0f;
    out[j] = store<T>(valid ? probability * scale : std::numeric_limits<float>::quiet_NaN());
  }
}

template <class T>
__global__ void mean_squared_error_kernel(const T* pred, const float* targets, const float* grad_scale, T* dpred,
                                          double* row_results, std::int64_t rows, std::int64_t cols) {
  const std::int64_t row = global_thread() / warp_threads;
  const int lane = static_cast<int>(threadIdx.x % warp_threads);
  if (row >= rows) return;
  const T* in = pred + row * cols;
  const float* target = targets + row * cols;
  T* out = dpred != nullptr ? dpred + row * cols : nullptr;
  const float gradient_factor = out != nullptr ? 2.0f * *grad_scale / static_cast<float>(cols) : 0.0f;
  float sum = 0.0f;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float difference = load(in[j]) - target[j];
    sum += difference * difference;
    if (out != nullptr) out[j] = store<T>(difference * gradient_factor);
  }
  sum = warp_sum(sum);
  if (lane == 0) {
    row_results[2 * row] = static_cast<double>(sum / static_cast<float>(cols));
    row_results[2 * row + 1] = 0.0;
  }
}

// Tree sum of one double per thread over a block (block_threads), fixed order; the result in thread 0.
__device__ double block_sum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = block_threads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

// sums += (sum of row losses, sum of correct flags), in a fixed order. One block.
__global__ void add_row_results_kernel(const double* row_results, std::int64_t rows, bool count_correct,
                                       LossSums* sums) {
  __shared__ double shared[block_threads];
  double loss = 0.0, correct = 0.0;
  for (std::int64_t i = threadIdx.x; i < rows; i += block_threads) {
    loss += row_results[2 * i];
    correct += row_results[2 * i + 1];
  }
  loss = block_sum(loss, shared);
  __syncthreads();
  correct = block_sum(correct, shared);
  if (threadIdx.x == 0) {
    sums->loss_sum += loss;
    if (count_correct) sums->correct += correct;
  }
}

// ---- column sums: out[j] (+)= sum_i value(i, j); blockDim (32, column_sum_slices), fixed order ----
template <class Value>
__global__ void column_sums_kernel(std::int64_t rows, std::int64_t cols, float* out, bool accumulate, Value value) {
  __shared__ float partial[column_sum_slices][warp_threads + 1];
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * warp_threads + threadIdx.x;
  float sum = 0.0f;
  if (j < cols)
    for (std::int64_t i = threadIdx.y; i < rows; i += column_sum_slices) sum += value(i, j);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float total = 0.0f;
    for (int slice = 0; slice < column_sum_slices; ++slice) total += partial[slice][threadIdx.x];
    out[j] = accumulate ? out[j] + total : total;
  }
}

template <class Value>
void launch_column_sums(cudaStream_t stream, std::int64_t rows, std::int64_t cols, float* out, bool accumulate,
                        Value value) {
  if (cols == 0) return;
  const dim3 block(warp_threads, column_sum_slices);
  const auto grid = static_cast<unsigned>((cols + warp_threads - 1) / warp_threads);
  column_sums_kernel<<<grid, block, 0, stream>>>(rows, cols, out, accumulate, value);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

template <class T>
struct GradientValue {  // dy[i][j]
  const T* dy;
  std::int64_t cols;
  __device__ float operator()(std::int64_t i, std::int64_t j) const { return load(dy[i * cols + j]); }
};
template <class T>
struct GammaGradientValue {  // dy[i][j] * xhat[i][j]
  const T* x;
  const T* dy;
  const float* mean;
  const float* rstd;
  std::int64_t cols;
  __device__ float operator()(std::int64_t i, std::int64_t j) const {
    return load(dy[i * cols + j]) * ((load(x[i * cols + j]) - mean[i]) * rstd[i]);
  }
};

// ---- optimizer ----
// Per chunk of statistics_chunk gradients: sum of squares (double) and a non-finite flag. One block per chunk.
__global__ void gradient_partials_kernel(const float* gradients, std::int64_t count, double* partial_sums,
                                         int* partial_nonfinite) {
  __shared__ double shared[block_threads];
  __shared__ int any_nonfinite;
  if (threadIdx.x == 0) any_nonfinite = 0;
  __syncthreads();
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * statistics_chunk;
  const std::int64_t end = begin + statistics_chunk < count ? begin + statistics_chunk : count;
  double sum = 0.0;
  bool nonfinite = false;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += block_threads) {
    const float g = gradients[i];
    nonfinite |= !km::is_finite(g);
    sum += static_cast<double>(g) * static_cast<double>(g);
  }
  if (nonfinite) any_nonfinite = 1;  // benign race: every writer writes 1
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    partial_sums[blockIdx.x] = sum;
    partial_nonfinite[blockIdx.x] = any_nonfinite;
  }
}

// One block: adds the partials in a fixed order and sets found_nonfinite, grad_norm and clip_coefficient.
__global__ void gradient_statistics_kernel(const double* partial_sums, const int* partial_nonfinite,
                                           std::int64_t chunks, float max_grad_norm, StepScalars* scalars) {
  __shared__ double shared[block_threads];
  double sum = 0.0, nonfinite = 0.0;
  for (std::int64_t chunk = threadIdx.x; chunk < chunks; chunk += block_threads) {
    sum += partial_sums[chunk];
    nonfinite += partial_nonfinite[chunk];
  }
  sum = block_sum(sum, shared);
  __syncthreads();
  nonfinite = block_sum(nonfinite, shared);
  if (threadIdx.x == 0) {
    const bool any_nonfinite = nonfinite > 0.0;
    const double norm = ::sqrt(sum) / static_cast<double>(scalars->loss_scale);
    scalars->found_nonfinite = any_nonfinite ? 1 : 0;
    scalars->grad_norm = static_cast<float>(norm);
    scalars->clip_coefficient = any_nonfinite ? 1.0f : km::clip_coefficient(static_cast<float>(norm), max_grad_norm);
  }
}

// W: the working copy's storage type (written when working is not null).
template <class W>
__global__ void adamw_kernel(float* parameters, const float* gradients, float* first_moment, float* second_moment,
                             std::int64_t count, W* working, float beta1, float beta2, float eps, float weight_decay,
                             const StepScalars* scalars) {
  if (scalars->found_nonfinite) return;
  const float inverse_loss_scale = 1.0f / scalars->loss_scale;
  const float clip = scalars->clip_coefficient;
  const auto constants =
      km::adamw_constants(scalars->learning_rate, beta1, beta2, eps, weight_decay, scalars->applied_steps + 1);
  for (std::int64_t i = global_thread(); i < count; i += grid_threads()) {
    const float g = gradients[i] * inverse_loss_scale * clip;
    float parameter = parameters[i], m = first_moment[i], v = second_moment[i];
    km::adamw_update(parameter, m, v, g, constants);
    parameters[i] = parameter;
    first_moment[i] = m;
    second_moment[i] = v;
    if (working != nullptr) working[i] = convert<W>(parameter);
  }
}

template <class W>
__global__ void sgd_kernel(float* parameters, const float* gradients, float* momentum_buffer, std::int64_t count,
                           W* working, float momentum, bool nesterov, float weight_decay, const StepScalars* scalars) {
  if (scalars->found_nonfinite) return;
  const float inverse_loss_scale = 1.0f / scalars->loss_scale;
  const float clip = scalars->clip_coefficient;
  const float learning_rate = scalars->learning_rate;
  const bool first_step = scalars->applied_steps == 0;
  for (std::int64_t i = global_thread(); i < count; i += grid_threads()) {
    const float g = gradients[i] * inverse_loss_scale * clip;
    float parameter = parameters[i];
    float buffer = momentum_buffer != nullptr ? momentum_buffer[i] : 0.0f;
    km::sgd_update(parameter, buffer, g, learning_rate, momentum, weight_decay, nesterov, first_step);
    parameters[i] = parameter;
    if (momentum_buffer != nullptr) momentum_buffer[i] = buffer;
    if (working != nullptr) working[i] = convert<W>(parameter);
  }
}

__global__ void finish_step_kernel(LossScalerConfig config, StepScalars* scalars) {
  km::update_loss_scale(config, *scalars);
}

__global__ void loss_gradient_scale_kernel(const StepScalars* scalars, float rows, float* grad_scale) {
  *grad_scale = scalars->loss_scale / rows;
}

// Grow-only device scratch (sized at construction; grows only on a first larger call, i.e. during warm-up).
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch() {
    if (data_ != nullptr) HPCTRAIN_CUDA_WARN(cudaFree(data_));
  }
  template <class T>
  T* reserve(std::size_t count, cudaStream_t stream) {
    const std::size_t bytes = std::max<std::size_t>(count * sizeof(T), 256);
    if (bytes > capacity_) {
      if (data_ != nullptr) {
        HPCTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));  // earlier kernels may still use it
        HPCTRAIN_CUDA_CHECK(cudaFree(data_));
        data_ = nullptr;
      }
      HPCTRAIN_CUDA_CHECK(cudaMalloc(&data_, bytes));
      capacity_ = bytes;
    }
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// Pinned host memory that per-step uploads (batches, the learning rate) pass through: cudaMemcpyAsync from pageable
// memory may wait for the stream, from pinned memory it does not. A ring: space is handed out in order and reused once
// the copies that read it have run (an event per region), so the host waits only for copies issued long before.
class PinnedRing {
 public:
  explicit PinnedRing(std::size_t capacity) : capacity_(capacity) {
    HPCTRAIN_CUDA_CHECK(cudaMallocHost(&data_, capacity));
  }
  PinnedRing(const PinnedRing&) = delete;
  PinnedRing& operator=(const PinnedRing&) = delete;
  ~PinnedRing() {
    for (const Region& region : in_flight_) HPCTRAIN_CUDA_WARN(cudaEventDestroy(region.event));
    for (cudaEvent_t event : spare_events_) HPCTRAIN_CUDA_WARN(cudaEventDestroy(event));
    if (data_ != nullptr) HPCTRAIN_CUDA_WARN(cudaFreeHost(data_));
  }
  [[nodiscard]] std::size_t capacity() const { return capacity_; }

  // Copies `bytes` from host memory to `destination` on `stream` through the ring (bytes <= capacity()).
  void upload(void* destination, const void* source, std::size_t bytes, cudaStream_t stream) {
    if (head_ + bytes > capacity_) head_ = 0;
    const std::size_t begin = head_, end = head_ + bytes;
    // Retire finished regions, then wait for any region still in flight that overlaps [begin, end): copies finish in
    // stream order, so waiting for the oldest first is right.
    while (!in_flight_.empty()) {
      const Region& oldest = in_flight_.front();
      bool overlapping = false;
      for (const Region& region : in_flight_) overlapping |= region.begin < end && begin < region.end;
      if (!overlapping && cudaEventQuery(oldest.event) != cudaSuccess) break;
      HPCTRAIN_CUDA_CHECK(cudaEventSynchronize(oldest.event));
      spare_events_.push_back(oldest.event);
      in_flight_.pop_front();
    }
    (void)cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady is not an error
    std::memcpy(data_ + begin, source, bytes);
    HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination, data_ + begin, bytes, cudaMemcpyHostToDevice, stream));
    cudaEvent_t event = nullptr;
    if (spare_events_.empty()) {
      HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } else {
      event = spare_events_.back();
      spare_events_.pop_back();
    }
    HPCTRAIN_CUDA_CHECK(cudaEventRecord(event, stream));
    in_flight_.push_back({begin, end, event});
    head_ = end;
  }

 private:
  struct Region {
    std::size_t begin, end;
    cudaEvent_t event;
  };
  char* data_ = nullptr;
  std::size_t capacity_;
  std::size_t head_ = 0;
  std::deque<Region> in_flight_;  // oldest first
  std::vector<cudaEvent_t> spare_events_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    const int devices = cuda_device_count();
    HPCTRAIN_VERIFY(devices > 0, InputError,
                    "run.device = \"cuda\" but no CUDA device is visible on this node (check the driver, "
                    "CUDA_VISIBLE_DEVICES and the job's GPU request)",
                    "use run.device = \"auto\" to fall back to the CPU", ErrorScope::this_rank);
    HPCTRAIN_ASSERT(device >= 0 && device < devices, "CUDA device " << device << " of " << devices);
    HPCTRAIN_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp properties{};
    HPCTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    name_ = std::string("cuda:") + std::to_string(device) + " (" + properties.name + ")";
    HPCTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    gemm_ = std::make_unique<cuda::CudaGemm>(stream_, false);
#if defined(HPCTRAIN_HAVE_CUDNN)
    convolution_ = std::make_unique<cuda::CudaConvolution>(stream_);
#endif
    uploads_ = std::make_unique<PinnedRing>(std::size_t{32} << 20);
    // Typical sizes, so that a normal run never grows them inside a step.
    bias_scratch_.reserve<float>(1 << 16, stream_);
    row_scratch_.reserve<double>(2 << 16, stream_);
  }
  ~CudaBackend() override {
    if (capturing_) {  // left by an exception during capture: end it so the stream can be destroyed
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial != nullptr) cudaGraphDestroy(partial);
      (void)cudaGetLastError();
    }
    if (graph_ != nullptr) HPCTRAIN_CUDA_WARN(cudaGraphExecDestroy(graph_));
    HPCTRAIN_CUDA_WARN(cudaStreamSynchronize(stream_));
    gemm_.reset();
#if defined(HPCTRAIN_HAVE_CUDNN)
    convolution_.reset();
#endif
    uploads_.reset();
    HPCTRAIN_CUDA_WARN(cudaStreamDestroy(stream_));
  }

  [[nodiscard]] std::string name() const override { return name_; }
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  [[nodiscard]] int device() const { return device_; }

  // ---- memory ----
  void* allocate(std::size_t bytes) override {
    void* pointer = nullptr;
    HPCTRAIN_CUDA_CHECK(cudaMalloc(&pointer, std::max<std::size_t>(bytes, 1)));  // 256-byte aligned
    return pointer;
  }
  void deallocate(void* pointer) override {
    if (pointer != nullptr) HPCTRAIN_CUDA_WARN(cudaFree(pointer));
  }
  // The source may be reused as soon as this returns. Up to a quarter of the pinned ring (per-step uploads) goes
  // through it without waiting for the stream; larger copies (set-up, checkpoint loads) go directly.
  void copy_to_backend(void* destination, const void* host_source, std::size_t bytes) override {
    if (bytes == 0) return;
    if (bytes <= uploads_->capacity() / 4) {
      uploads_->upload(destination, host_source, bytes, stream_);
    } else {
      HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination, host_source, bytes, cudaMemcpyHostToDevice, stream_));
      HPCTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the source must stay valid until the copy ran
    }
  }
  void copy_to_host(void* host_destination, const void* source, std::size_t bytes) override {
    if (bytes == 0) return;
    HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(host_destination, source, bytes, cudaMemcpyDeviceToHost, stream_));
    HPCTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy(void* destination, const void* source, std::size_t bytes) override {
    if (bytes == 0 || destination == source) return;
    const auto* d = static_cast<const char*>(destination);
    const auto* s = static_cast<const char*>(source);
    HPCTRAIN_ASSERT(d + bytes <= s || s + bytes <= d, "copy: overlapping device ranges");
    HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void zero(void* pointer, std::size_t bytes) override {
    if (bytes > 0) HPCTRAIN_CUDA_CHECK(cudaMemsetAsync(pointer, 0, bytes, stream_));
  }
  void synchronize() override { HPCTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // ---- conversions ----
  void cast(const TensorView& source, const TensorView& destination) override {
    HPCTRAIN_ASSERT(source.size() == destination.size(),
                    "cast: " << source.size() << " elements into " << destination.size());
    if (source.dtype == destination.dtype && source.dtype != DType::f64) {
      copy(destination.data, source.data, source.bytes());
      return;
    }
    dispatch_storage(source.dtype, "cast", [&]<class TS>() {
      dispatch_storage(destination.dtype, "cast", [&]<class TD>() {
        launch_map(stream_, static_cast<const TS*>(source.data), static_cast<const TS*>(nullptr),
                   static_cast<TD*>(destination.data), source.size(), CastOp<TS, TD>{});
      });
    });
  }

  // ---- matrix products ----
  void gemm(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
            const void* bias, bool accumulate) override {
    const void* converted_bias = nullptr;
    if (bias != nullptr) {
      // cuBLASLt's bias has the output's dtype: convert the fp32 master bias into aligned scratch.
      dispatch_storage(c.dtype, "gemm", [&]<class TC>() {
        TC* scratch = bias_scratch_.reserve<TC>(static_cast<std::size_t>(c.cols), stream_);
        launch_map(stream_, static_cast<const float*>(bias), static_cast<const float*>(nullptr), scratch, c.cols,
                   CastOp<float, TC>{});
        converted_bias = scratch;
      });
    }
    gemm_->run(a, transpose_a, b, transpose_b, c, converted_bias, accumulate);
  }

  void bias_gradient(const TensorView& dy, void* dbias, DType master, bool accumulate) override {
    HPCTRAIN_ASSERT(master == DType::f32, "bias_gradient: master " << dtype_name(master) << " on the CUDA backend");
    dispatch_storage(dy.dtype, "bias_gradient", [&]<class T>() {
      launch_column_sums(stream_, dy.rows, dy.cols, static_cast<float*>(dbias), accumulate,
                         GradientValue<T>{static_cast<const T*>(dy.data), dy.cols});
    });
  }

  // ---- element-wise ----
  void activation_forward(Activation kind, float alpha, const TensorView& x, const TensorView& y) override {
    check_same_shape(x, y, "activation_forward");
    dispatch_storage(x.dtype, "activation_forward", [&]<class T>() {
      launch_activation<ActivationForwardOp, T>(stream_, kind, alpha, static_cast<const T*>(x.data), nullptr,
                                                static_cast<T*>(y.data), x.size());
    });
  }

  void activation_backward(Activation kind, float alpha, const TensorView& x, const TensorView& dy,
                           const TensorView& dx) override {
    check_same_shape(x, dy, "activation_backward");
    check_same_shape(x, dx, "activation_backward");
    dispatch_storage(x.dtype, "activation_backward", [&]<class T>() {
      launch_activation<ActivationBackwardOp, T>(stream_, kind, alpha, static_cast<const T*>(x.data),
                                                 static_cast<const T*>(dy.data), static_cast<T*>(dx.data), x.size());
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
    if (x.rows == 0) return;
    dispatch_storage(x.dtype, "layernorm_forward", [&]<class T>() {
      layernorm_forward_kernel<<<row_grid(x.rows), block_threads, 0, stream_>>>(
          static_cast<const T*>(x.data), static_cast<const float*>(gamma), static_cast<const float*>(beta), eps,
          static_cast<T*>(y.data), static_cast<float*>(mean), static_cast<float*>(rstd), x.rows, x.cols);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    });
  }

  void layernorm_backward(const TensorView& x, const TensorView& dy, const void* gamma, const void* mean,
                          const void* rstd, const TensorView& dx, void* dgamma, void* dbeta, bool accumulate) override {
    check_same_shape(x, dy, "layernorm_backward");
    check_same_shape(x, dx, "layernorm_backward");
    dispatch_storage(x.dtype, "layernorm_backward", [&]<class T>() {
      const T* in = static_cast<const T*>(x.data);
      const T* gradient = static_cast<const T*>(dy.data);
      const auto* row_mean = static_cast<const float*>(mean);
      const auto* row_rstd = static_cast<const float*>(rstd);
      // Parameter gradients first: dx may alias dy (kernels on one stream run in order).
      if (dgamma != nullptr)
        launch_column_sums(stream_, x.rows, x.cols, static_cast<float*>(dgamma), accumulate,
                           GammaGradientValue<T>{in, gradient, row_mean, row_rstd, x.cols});
      if (dbeta != nullptr)
        launch_column_sums(stream_, x.rows, x.cols, static_cast<float*>(dbeta), accumulate,
                           GradientValue<T>{gradient, x.cols});
      if (x.rows == 0) return;
      layernorm_backward_kernel<<<row_grid(x.rows), block_threads, 0, stream_>>>(
          in, gradient, static_cast<const float*>(gamma), row_mean, row_rstd, static_cast<T*>(dx.data), x.rows, x.cols);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    });
  }

  // ---- losses ----
  // ---- convolutional networks (cuda_convolution.cu: cuDNN; cuda_spatial.cu: own kernels) ----
  // Channels-first only: preferred_spatial_layout() keeps the default, so models never hand this backend another one.
#if defined(HPCTRAIN_HAVE_CUDNN)
  void convolution_forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& weight,
                           const void* bias, const TensorView& y) override {
    require_channels_first(geometry.layout);
    convolution_->forward(geometry, x, weight, bias, y);
  }
  void convolution_backward_data(const SpatialGeometry& geometry, const TensorView& dy, const TensorView& weight,
                                 const TensorView& dx) override {
    require_channels_first(geometry.layout);
    convolution_->backward_data(geometry, dy, weight, dx);
  }
  void convolution_backward_weights(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                                    const TensorView& dweight, void* dbias, bool accumulate) override {
    require_channels_first(geometry.layout);
    convolution_->backward_weights(geometry, x, dy, dweight, dbias, accumulate);
  }
#endif
  void pooling_forward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x,
                       const TensorView& y) override {
    require_channels_first(geometry.layout);
    cuda::pooling_forward(stream_, kind, geometry, x, y);
  }
  void pooling_backward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                        const TensorView& dx) override {
    require_channels_first(geometry.layout);
    cuda::pooling_backward(stream_, kind, geometry, x, dy, dx);
  }
  void groupnorm_forward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                         const void* gamma, const void* beta, float eps, const TensorView& y, void* mean,
                         void* rstd) override {
    require_channels_first(layout);
    cuda::groupnorm_forward(stream_, channels, groups, x, static_cast<const float*>(gamma),
                            static_cast<const float*>(beta), eps, y, static_cast<float*>(mean),
                            static_cast<float*>(rstd));
  }
  void groupnorm_backward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                          const TensorView& dy, const void* gamma, const void* mean, const void* rstd,
                          const TensorView& dx, void* dgamma, void* dbeta, bool accumulate) override {
    require_channels_first(layout);
    cuda::groupnorm_backward(stream_, channels, groups, x, dy, static_cast<const float*>(gamma),
                             static_cast<const float*>(mean), static_cast<const float*>(rstd), dx,
                             static_cast<float*>(dgamma), static_cast<float*>(dbeta), accumulate);
  }
  static void require_channels_first(SpatialLayout layout) {
    HPCTRAIN_ASSERT(layout == SpatialLayout::channels_first, "the CUDA backend's spatial kernels are channels-first");
  }
  // Convolutions need cuDNN (a build without it keeps the NotSupported defaults and refuses spatial decks).
  [[nodiscard]] bool has_spatial_operations() const override { return cuda::have_convolutions(); }

  void softmax_cross_entropy(const TensorView& logits, const std::int32_t* labels, const float* grad_scale,
                             const TensorView& dlogits, LossSums* sums) override {
    const bool with_gradient = dlogits.data != nullptr;
    if (with_gradient) check_same_shape(logits, dlogits, "softmax_cross_entropy");
    HPCTRAIN_ASSERT(logits.cols > 0 || logits.rows == 0, "softmax_cross_entropy: no classes");
    if (logits.rows == 0) return;
    double* row_results = row_scratch_.reserve<double>(static_cast<std::size_t>(2 * logits.rows), stream_);
    dispatch_storage(logits.dtype, "softmax_cross_entropy", [&]<class T>() {
      softmax_cross_entropy_kernel<<<row_grid(logits.rows), block_threads, 0, stream_>>>(
          static_cast<const T*>(logits.data), labels, grad_scale, static_cast<T*>(dlogits.data), row_results,
          logits.rows, logits.cols);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    });
    add_row_results(row_results, logits.rows, true, sums);
  }

  void mean_squared_error(const TensorView& pred, const void* targets, const float* grad_scale, const TensorView& dpred,
                          LossSums* sums) override {
    const bool with_gradient = dpred.data != nullptr;
    if (with_gradient) check_same_shape(pred, dpred, "mean_squared_error");
    HPCTRAIN_ASSERT(pred.cols > 0 || pred.rows == 0, "mean_squared_error: no columns");
    if (pred.rows == 0) return;
    double* row_results = row_scratch_.reserve<double>(static_cast<std::size_t>(2 * pred.rows), stream_);
    dispatch_storage(pred.dtype, "mean_squared_error", [&]<class T>() {
      mean_squared_error_kernel<<<row_grid(pred.rows), block_threads, 0, stream_>>>(
          static_cast<const T*>(pred.data), static_cast<const float*>(targets), grad_scale, static_cast<T*>(dpred.data),
          row_results, pred.rows, pred.cols);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    });
    add_row_results(row_results, pred.rows, false, sums);
  }

  // ---- optimizer ----
  void gradient_statistics(const float* gradients, std::int64_t count, const OptimizerHyper& hyper,
                           StepScalars* scalars) override {
    const std::int64_t chunks = std::max<std::int64_t>((count + statistics_chunk - 1) / statistics_chunk, 1);
    // (chunks) sums, then (chunks) flags, in one scratch buffer.
    auto* partial_sums = statistics_scratch_.reserve<double>(static_cast<std::size_t>(2 * chunks), stream_);
    auto* partial_nonfinite = reinterpret_cast<int*>(partial_sums + chunks);
    HPCTRAIN_ASSERT(chunks <= std::numeric_limits<int>::max(), "gradient_statistics: " << count << " gradients");
    gradient_partials_kernel<<<static_cast<unsigned>(chunks), block_threads, 0, stream_>>>(
        gradients, count, partial_sums, partial_nonfinite);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
    gradient_statistics_kernel<<<1, block_threads, 0, stream_>>>(partial_sums, partial_nonfinite, chunks,
                                                                 hyper.max_grad_norm, scalars);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  }

  void optimizer_step(const OptimizerHyper& hyper, bool decay, float* parameters, const float* gradients, float* state1,
                      float* state2, std::int64_t count, const TensorView& working,
                      const StepScalars* scalars) override {
    if (count == 0) return;
    if (working.data != nullptr)
      HPCTRAIN_ASSERT(working.size() == count,
                      "optimizer_step: working copy of " << working.size() << " elements for " << count);
    const float weight_decay = decay ? hyper.weight_decay : 0.0f;
    const DType working_dtype = working.data != nullptr ? working.dtype : DType::f32;
    dispatch_storage(working_dtype, "optimizer_step", [&]<class W>() {
      W* copy = static_cast<W*>(working.data);
      if (hyper.type == OptimizerType::adamw) {
        HPCTRAIN_ASSERT(state1 != nullptr && state2 != nullptr, "AdamW needs both moment buffers");
        adamw_kernel<<<grid_for(count), block_threads, 0, stream_>>>(parameters, gradients, state1, state2, count, copy,
                                                                     hyper.beta1, hyper.beta2, hyper.eps, weight_decay,
                                                                     scalars);
      } else {
        HPCTRAIN_ASSERT(hyper.momentum == 0.0f || state1 != nullptr, "SGD with momentum needs a momentum buffer");
        sgd_kernel<<<grid_for(count), block_threads, 0, stream_>>>(
            parameters, gradients, hyper.momentum != 0.0f ? state1 : nullptr, count, copy, hyper.momentum,
            hyper.nesterov, weight_decay, scalars);
      }
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    });
  }

  void finish_step(const LossScalerConfig& config, StepScalars* scalars) override {
    finish_step_kernel<<<1, 1, 0, stream_>>>(config, scalars);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  }

  // ---- step graphs ----
  // Thread-local capture: the data loader's thread never calls CUDA, and this thread's own illegal calls during a
  // capture (a synchronisation) fail loudly instead of corrupting the graph.
  void begin_capture() override {
    HPCTRAIN_ASSERT(!capturing_, "begin_capture: already capturing");
    HPCTRAIN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
  }
  void end_capture() override {
    HPCTRAIN_ASSERT(capturing_, "end_capture without begin_capture");
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    HPCTRAIN_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    if (graph_ != nullptr) {
      HPCTRAIN_CUDA_CHECK(cudaGraphExecDestroy(graph_));
      graph_ = nullptr;
    }
    const cudaError_t status = cudaGraphInstantiate(&graph_, graph, 0);
    HPCTRAIN_CUDA_WARN(cudaGraphDestroy(graph));
    HPCTRAIN_CUDA_CHECK(status);
  }
  void replay_capture() override {
    HPCTRAIN_ASSERT(graph_ != nullptr, "replay_capture: nothing captured");
    HPCTRAIN_CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
  }

  void loss_gradient_scale(const StepScalars* scalars, float rows, float* grad_scale) override {
    loss_gradient_scale_kernel<<<1, 1, 0, stream_>>>(scalars, rows, grad_scale);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  }

 private:
  // One warp per row.
  static unsigned row_grid(std::int64_t rows) {
    constexpr std::int64_t rows_per_block = block_threads / warp_threads;
    return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  }

  void dropout(float p, std::uint64_t seed, std::uint32_t step, std::uint32_t layer, const std::int64_t* sample_ids,
               const TensorView& in, const TensorView& out, const char* what) {
    check_same_shape(in, out, what);
    HPCTRAIN_ASSERT(p >= 0.0f && p <= 1.0f, what << ": probability " << p << " outside [0, 1]");
    if (p == 0.0f) {  // identity
      copy(out.data, in.data, in.bytes());
      return;
    }
    if (in.size() == 0) return;
    const std::uint64_t key = km::dropout_key(seed, step);
    dispatch_storage(in.dtype, what, [&]<class T>() {
      dropout_kernel<<<grid_for(in.size()), block_threads, 0, stream_>>>(
          p, key, layer, sample_ids, static_cast<const T*>(in.data), static_cast<T*>(out.data), in.rows, in.cols);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    });
  }

  void add_row_results(const double* row_results, std::int64_t rows, bool count_correct, LossSums* sums) {
    if (sums == nullptr) return;
    add_row_results_kernel<<<1, block_threads, 0, stream_>>>(row_results, rows, count_correct, sums);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  }

  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CudaGemm> gemm_;
#if defined(HPCTRAIN_HAVE_CUDNN)
  std::unique_ptr<cuda::CudaConvolution> convolution_;  // cuDNN plans, made on first use of a shape
#endif
  std::unique_ptr<PinnedRing> uploads_;  // per-step host -> device copies
  bool capturing_ = false;
  cudaGraphExec_t graph_ = nullptr;   // the captured step
  DeviceScratch bias_scratch_;        // (cols) the bias in the gemm output's dtype
  DeviceScratch row_scratch_;         // (rows, 2) per-row loss and correct flag
  DeviceScratch statistics_scratch_;  // (chunks) partial sums + (chunks) flags
};

CudaBackend& as_cuda(Backend& backend) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  HPCTRAIN_ASSERT(cuda_backend != nullptr, "backend " << backend.name() << " is not a CUDA backend");
  return *cuda_backend;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

cudaStream_t cuda_stream_of(Backend& backend) { return as_cuda(backend).stream(); }
int cuda_device_of(Backend& backend) { return as_cuda(backend).device(); }

}  // namespace hpctrain
