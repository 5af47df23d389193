// Element-wise kernels of the CUDA backend (see cuda_elementwise.hpp): casts, activations, dropout.
#include "cuda_device.cuh"
#include "cuda_dispatch.hpp"
#include "cuda_elementwise.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/math.hpp"

namespace hpctrain::cuda {
namespace {

namespace km = kernel_math;

// out[i] = op(in0[i], in1[i]) (in1 may be null: op gets in0[i] twice). out may alias in0 or in1: a thread reads its
// elements before it writes them.
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

template <class T>
struct AddOp {
  __device__ T operator()(T a, T b) const { return store<T>(load(a) + load(b)); }
};

template <class T, Activation kind>
__device__ __forceinline__ float activation_value(float x, float alpha) {
  if constexpr (kind == Activation::relu) return km::relu(x);
  if constexpr (kind == Activation::gelu) return km::gelu(x);
  if constexpr (kind == Activation::gelu_tanh) return km::gelu_tanh(x);
  if constexpr (kind == Activation::tanh) return km::tanh_activation(x);
  if constexpr (kind == Activation::leaky_relu) return km::leaky_relu(x, alpha);
}
template <class T, Activation kind>
__device__ __forceinline__ float activation_derivative(float x, float alpha) {
  if constexpr (kind == Activation::relu) return km::relu_derivative(x);
  if constexpr (kind == Activation::gelu) return km::gelu_derivative(x);
  if constexpr (kind == Activation::gelu_tanh) return km::gelu_tanh_derivative(x);
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
    case Activation::gelu_tanh:
      return launch_map(stream, x, dy, out, count, Op<T, Activation::gelu_tanh>{alpha});
    case Activation::tanh:
      return launch_map(stream, x, dy, out, count, Op<T, Activation::tanh>{alpha});
    case Activation::leaky_relu:
      return launch_map(stream, x, dy, out, count, Op<T, Activation::leaky_relu>{alpha});
  }
  HPCTRAIN_ASSERT(false, "unknown activation " << static_cast<int>(kind));
}

// The CPU backend's mask, element by element from its global index. Index: uint32 (with a precomputed divisor for
// the row) when the view has fewer than 2^31 elements, int64 otherwise.
template <class T, class Index>
__global__ void dropout_kernel(float p, std::uint64_t key, std::uint32_t layer, const std::int64_t* sample_ids,
                               const T* in, T* out, Index count, Index cols, km::FastDivisor row_of) {
  const float scale = km::dropout_scale<float>(p);
  for (Index index = static_cast<Index>(global_thread()); index < count; index += static_cast<Index>(grid_threads())) {
    Index row;
    if constexpr (sizeof(Index) == 4)
      row = row_of.quotient(index);
    else
      row = index / cols;
    const Index col = index - row * cols;
    const std::uint64_t element = static_cast<std::uint64_t>(sample_ids[row]) * static_cast<std::uint64_t>(cols) +
                                  static_cast<std::uint64_t>(col);
    const bool keep = km::dropout_uniform(key, layer, element) >= p;
    out[index] = store<T>(load(in[index]) * (keep ? scale : 0.0f));
  }
}

}  // namespace

void cast(cudaStream_t stream, const TensorView& source, const TensorView& destination) {
  dispatch_storage(source.dtype, "cast", [&]<class TS>() {
    dispatch_storage(destination.dtype, "cast", [&]<class TD>() {
      launch_map(stream, static_cast<const TS*>(source.data), static_cast<const TS*>(nullptr),
                 static_cast<TD*>(destination.data), source.size(), CastOp<TS, TD>{});
    });
  });
}

void cast_from_float(cudaStream_t stream, const float* in, std::int64_t count, DType dtype, void* out) {
  dispatch_storage(dtype, "cast", [&]<class TD>() {
    launch_map(stream, in, static_cast<const float*>(nullptr), static_cast<TD*>(out), count, CastOp<float, TD>{});
  });
}

void activation_forward(cudaStream_t stream, Activation kind, float alpha, const TensorView& x, const TensorView& y) {
  dispatch_storage(x.dtype, "activation_forward", [&]<class T>() {
    launch_activation<ActivationForwardOp, T>(stream, kind, alpha, static_cast<const T*>(x.data), nullptr,
                                              static_cast<T*>(y.data), x.size());
  });
}

void activation_backward(cudaStream_t stream, Activation kind, float alpha, const TensorView& x, const TensorView& dy,
                         const TensorView& dx) {
  dispatch_storage(x.dtype, "activation_backward", [&]<class T>() {
    launch_activation<ActivationBackwardOp, T>(stream, kind, alpha, static_cast<const T*>(x.data),
                                               static_cast<const T*>(dy.data), static_cast<T*>(dx.data), x.size());
  });
}

void add(cudaStream_t stream, const TensorView& a, const TensorView& b, const TensorView& sum) {
  dispatch_storage(a.dtype, "add", [&]<class T>() {
    launch_map(stream, static_cast<const T*>(a.data), static_cast<const T*>(b.data), static_cast<T*>(sum.data),
               a.size(), AddOp<T>{});
  });
}

void dropout(cudaStream_t stream, float p, std::uint64_t key, std::uint32_t layer, const std::int64_t* sample_ids,
             const TensorView& in, const TensorView& out) {
  const std::int64_t count = in.size();
  if (count == 0) return;
  dispatch_storage(in.dtype, "dropout", [&]<class T>() {
    const auto* source = static_cast<const T*>(in.data);
    auto* destination = static_cast<T*>(out.data);
    if (count < (std::int64_t{1} << 31)) {
      dropout_kernel<T, std::uint32_t><<<grid_for(count), block_threads, 0, stream>>>(
          p, key, layer, sample_ids, source, destination, static_cast<std::uint32_t>(count),
          static_cast<std::uint32_t>(in.cols), km::FastDivisor(static_cast<std::uint32_t>(in.cols)));
    } else {
      dropout_kernel<T, std::int64_t><<<grid_for(count), block_threads, 0, stream>>>(
          p, key, layer, sample_ids, source, destination, count, in.cols, km::FastDivisor());
    }
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hpctrain::cuda
