// Row kernels of the CUDA backend (see cuda_rows.hpp): layernorm and the losses, a warp per row; the per-row results of
// the losses added in a fixed order.
#include <limits>

#include "cuda_dispatch.hpp"
#include "cuda_normalization.hpp"
#include "cuda_reductions.cuh"
#include "cuda_rows.hpp"
#include "hpctrain/kernels/math.hpp"

namespace hpctrain::cuda {
namespace {

namespace km = kernel_math;

// One warp per row.
unsigned row_grid(std::int64_t rows) {
  constexpr std::int64_t rows_per_block = block_threads / warp_threads;
  return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
}

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

// A row's maximum and its first index (ties -> lowest index, as the CPU backend), over the warp.
template <class T>
__device__ void warp_row_argmax(const T* in, std::int64_t cols, int lane, float& max_value, std::int64_t& argmax) {
  max_value = -std::numeric_limits<float>::infinity();
  argmax = cols;
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
}

// Per row: (loss, correct) into row_results (rows, 2). An out-of-range label gives a NaN loss (the CPU backend throws
// InputError; the trainer validates labels when it reads the data, so this only guards against corrupted memory).
// km::ignored_label (a sequence target not scored): no loss, a zero gradient, as kernel_math's row function.
template <class T>
__global__ void softmax_cross_entropy_kernel(const T* logits, const std::int32_t* labels, const float* grad_scale,
                                             T* dlogits, double* row_results, std::int64_t rows, std::int64_t cols) {
  const std::int64_t row = global_thread() / warp_threads;
  const int lane = static_cast<int>(threadIdx.x % warp_threads);
  if (row >= rows) return;
  if (labels[row] == km::ignored_label) {
    if (lane == 0) row_results[2 * row] = row_results[2 * row + 1] = 0.0;
    if (dlogits != nullptr)
      for (std::int64_t j = lane; j < cols; j += warp_threads) dlogits[row * cols + j] = store<T>(0.0f);
    return;
  }
  const T* in = logits + row * cols;
  float max_value = 0.0f;
  std::int64_t argmax = 0;
  warp_row_argmax(in, cols, lane, max_value, argmax);
  const std::int32_t label = labels[row];
  const bool valid = label >= 0 && label < cols;
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
  // Every lane's read of in[label] (and of its logits above) before any lane writes the gradient over the logits:
  // the shuffles above do not order memory accesses of diverged lanes, a barrier does.
  __syncwarp();
  const float scale = *grad_scale;
  const float inverse_sum = 1.0f / sum;
  T* out = dlogits + row * cols;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    float probability = km::exponential(load(in[j]) - max_value) * inverse_sum;
    if (j == label) probability -= 1.0f;
    out[j] = store<T>(valid ? probability * scale : std::numeric_limits<float>::quiet_NaN());
  }
}

// With class weights (null: 1) and label smoothing: kernel_math::smoothed_cross_entropy_loss and _gradient per row,
// a warp per row as above.
template <class T>
__global__ void smoothed_softmax_cross_entropy_kernel(const T* logits, const std::int32_t* labels,
                                                      const float* class_weights, float smoothing,
                                                      const float* grad_scale, T* dlogits, double* row_results,
                                                      std::int64_t rows, std::int64_t cols) {
  const std::int64_t row = global_thread() / warp_threads;
  const int lane = static_cast<int>(threadIdx.x % warp_threads);
  if (row >= rows) return;
  const T* in = logits + row * cols;
  float max_value = 0.0f;
  std::int64_t argmax = 0;
  warp_row_argmax(in, cols, lane, max_value, argmax);
  const auto weight = [class_weights](std::int64_t j) { return class_weights != nullptr ? class_weights[j] : 1.0f; };
  const std::int32_t label = labels[row];
  const bool valid = label >= 0 && label < cols;
  const float label_logit = valid ? load(in[label]) - max_value : std::numeric_limits<float>::quiet_NaN();
  const float label_weight = valid ? weight(label) : std::numeric_limits<float>::quiet_NaN();
  float sum = 0.0f, weighted_logit_sum = 0.0f, class_weight_sum = 0.0f;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float shifted = load(in[j]) - max_value;
    sum += km::exponential(shifted);
    weighted_logit_sum += weight(j) * shifted;
    class_weight_sum += weight(j);
  }
  sum = warp_sum(sum);
  weighted_logit_sum = warp_sum(weighted_logit_sum);
  class_weight_sum = warp_sum(class_weight_sum);
  if (lane == 0) {
    const float loss = km::smoothed_cross_entropy_loss(km::natural_log(sum), label_logit, label_weight,
                                                       weighted_logit_sum, class_weight_sum, smoothing, cols);
    row_results[2 * row] = static_cast<double>(loss);
    row_results[2 * row + 1] = valid && argmax == label ? 1.0 : 0.0;
  }
  if (dlogits == nullptr) return;
  __syncwarp();  // every lane's reads of the logits before any lane overwrites them (as above)
  const float scale = *grad_scale;
  const float inverse_sum = 1.0f / sum;
  T* out = dlogits + row * cols;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float probability = km::exponential(load(in[j]) - max_value) * inverse_sum;
    const float gradient = km::smoothed_cross_entropy_gradient(probability, j == label, weight(j), label_weight,
                                                               class_weight_sum, smoothing, cols);
    out[j] = store<T>(valid ? gradient * scale : std::numeric_limits<float>::quiet_NaN());
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

// sums += (sum of row losses, sum of correct flags), in a fixed order. One block.
__global__ void add_row_results_kernel(const double* row_results, std::int64_t rows, bool count_correct,
                                       LossSums* sums) {
  __shared__ double shared[block_threads];
  double loss = 0.0, correct = 0.0;
  for (std::int64_t i = threadIdx.x; i < rows; i += block_threads) {
    loss += row_results[2 * i];
    correct += row_results[2 * i + 1];
  }
  loss = block_tree_sum(loss, shared);
  correct = block_tree_sum(correct, shared);
  if (threadIdx.x == 0) {
    sums->loss_sum += loss;
    if (count_correct) sums->correct += correct;
  }
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

void add_row_results(cudaStream_t stream, const double* row_results, std::int64_t rows, bool count_correct,
                     LossSums* sums) {
  if (sums == nullptr) return;
  add_row_results_kernel<<<1, block_threads, 0, stream>>>(row_results, rows, count_correct, sums);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(cudaStream_t stream, RowScratch& scratch, const TensorView& x, const float* gamma,
                       const float* beta, float eps, const TensorView& y, float* mean, float* rstd) {
  if (x.rows == 0) return;
  if (layernorm_uses_segments(x.rows, x.cols)) {
    normalize_forward(stream, scratch.partials, {x.rows, x.cols}, x, gamma, beta, eps, y, mean, rstd);
    return;
  }
  dispatch_storage(x.dtype, "layernorm_forward", [&]<class T>() {
    layernorm_forward_kernel<<<row_grid(x.rows), block_threads, 0, stream>>>(
        static_cast<const T*>(x.data), gamma, beta, eps, static_cast<T*>(y.data), mean, rstd, x.rows, x.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void layernorm_backward(cudaStream_t stream, RowScratch& scratch, const TensorView& x, const TensorView& dy,
                        const float* gamma, const float* mean, const float* rstd, const TensorView& dx, float* dgamma,
                        float* dbeta, bool accumulate) {
  dispatch_storage(x.dtype, "layernorm_backward", [&]<class T>() {
    const T* in = static_cast<const T*>(x.data);
    const T* gradient = static_cast<const T*>(dy.data);
    // Parameter gradients first: dx may alias dy (kernels on one stream run in order).
    if (dgamma != nullptr)
      launch_column_sums(stream, scratch.partials, x.rows, x.cols, dgamma, accumulate,
                         GammaGradientValue<T>{in, gradient, mean, rstd, x.cols});
    if (dbeta != nullptr)
      launch_column_sums(stream, scratch.partials, x.rows, x.cols, dbeta, accumulate,
                         GradientValue<T>{gradient, x.cols});
    if (x.rows == 0) return;
    if (layernorm_uses_segments(x.rows, x.cols)) {
      normalize_backward_data(stream, scratch.partials, {x.rows, x.cols}, x, dy, gamma, mean, rstd, dx);
      return;
    }
    layernorm_backward_kernel<<<row_grid(x.rows), block_threads, 0, stream>>>(in, gradient, gamma, mean, rstd,
                                                                              static_cast<T*>(dx.data), x.rows, x.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void bias_gradient(cudaStream_t stream, RowScratch& scratch, const TensorView& dy, float* dbias, bool accumulate) {
  dispatch_storage(dy.dtype, "bias_gradient", [&]<class T>() {
    launch_column_sums(stream, scratch.partials, dy.rows, dy.cols, dbias, accumulate,
                       GradientValue<T>{static_cast<const T*>(dy.data), dy.cols});
  });
}

void channels_last_sums(cudaStream_t stream, RowScratch& scratch, const TensorView& dy, std::int64_t channels,
                        float* dbias, bool accumulate) {
  const TensorView positions{dy.data, dy.dtype, dy.rows * (dy.cols / channels), channels};
  bias_gradient(stream, scratch, positions, dbias, accumulate);
}

void softmax_cross_entropy(cudaStream_t stream, RowScratch& scratch, const TensorView& logits,
                           const std::int32_t* labels, const float* grad_scale, const TensorView& dlogits,
                           LossSums* sums) {
  if (logits.rows == 0) return;
  auto* row_results = scratch.row_results.reserve_elements<double>(static_cast<std::size_t>(2 * logits.rows));
  dispatch_storage(logits.dtype, "softmax_cross_entropy", [&]<class T>() {
    softmax_cross_entropy_kernel<<<row_grid(logits.rows), block_threads, 0, stream>>>(
        static_cast<const T*>(logits.data), labels, grad_scale, static_cast<T*>(dlogits.data), row_results, logits.rows,
        logits.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
  add_row_results(stream, row_results, logits.rows, true, sums);
}

void smoothed_softmax_cross_entropy(cudaStream_t stream, RowScratch& scratch, const TensorView& logits,
                                    const std::int32_t* labels, const CrossEntropyOptions& options,
                                    const float* grad_scale, const TensorView& dlogits, LossSums* sums) {
  if (logits.rows == 0) return;
  auto* row_results = scratch.row_results.reserve_elements<double>(static_cast<std::size_t>(2 * logits.rows));
  dispatch_storage(logits.dtype, "smoothed_softmax_cross_entropy", [&]<class T>() {
    smoothed_softmax_cross_entropy_kernel<<<row_grid(logits.rows), block_threads, 0, stream>>>(
        static_cast<const T*>(logits.data), labels, options.class_weights, options.label_smoothing, grad_scale,
        static_cast<T*>(dlogits.data), row_results, logits.rows, logits.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
  add_row_results(stream, row_results, logits.rows, true, sums);
}

void mean_squared_error(cudaStream_t stream, RowScratch& scratch, const TensorView& pred, const float* targets,
                        const float* grad_scale, const TensorView& dpred, LossSums* sums) {
  if (pred.rows == 0) return;
  auto* row_results = scratch.row_results.reserve_elements<double>(static_cast<std::size_t>(2 * pred.rows));
  dispatch_storage(pred.dtype, "mean_squared_error", [&]<class T>() {
    mean_squared_error_kernel<<<row_grid(pred.rows), block_threads, 0, stream>>>(
        static_cast<const T*>(pred.data), targets, grad_scale, static_cast<T*>(dpred.data), row_results, pred.rows,
        pred.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
  add_row_results(stream, row_results, pred.rows, false, sums);
}

}  // namespace hpctrain::cuda
