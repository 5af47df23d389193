// Convolutions of the CUDA backend through cuDNN's convolution API (cudnn_cnn), on the model's plain NCHW / NCDHW rows
// and PyTorch-shaped (out, in/groups, k...) weights; stride, padding, dilation and groups map directly.
//
// - Compute is fp32 for every storage dtype. f32 storage runs with CUDNN_FMA_MATH (no TF32), as the matrix products
//   (CUBLAS_COMPUTE_32F), unless precision.tf32 allows tensor-core math (CUDNN_TENSOR_OP_MATH). bf16/f16 forward and
//   data gradient run on the 16-bit operands (tensor cores, fp32 accumulation); the output is rounded once.
// - Weight gradients are fp32 (the master dtype) whatever the storage: for bf16/f16 the inputs are widened into fp32
//   scratch first (cuDNN's 16-bit weight gradient would round it to 16 bits). Those widened values are exact in TF32,
//   so that pass may use tensor ops without losing anything. The bias gradient is an own two-pass reduction over
//   (sample, channel) planes cut into chunks (cuda_normalization.cu), fixed order, fp32.
// - Bias: the fp32 master bias is broadcast into the output (rounded to its dtype, as the gemm's bias epilogue) and
//   the convolution adds onto it with beta = 1, so the sum is rounded once.
// - A plan (descriptors, the heuristic's first deterministic algorithm that needs no precision-losing conversion and
//   whose workspace stays under a cap, its workspace) is made on the first call of a (geometry, rows, dtype, pass) and
//   cached; a partial last batch is one more plan. Each choice is noted for the log (Backend::take_notes), saying
//   when no deterministic algorithm fitted (kernels/cuda/algorithm_choice.hpp). When cuDNN has no algorithm for a
//   16-bit configuration (or refuses to run the one its heuristic offered: CUDNN_STATUS_NOT_SUPPORTED), that plan is
//   replaced by one running in fp32 on widened copies.
// - The workspace and the staging buffers (widened operands, weights at offsets cuDNN may not accept) grow only,
//   on the first call that needs more: during the warm-up steps, never in a steady-state step or a captured graph.
//   Replaced buffers are kept until destruction, so a captured graph never points at freed memory.
#include <algorithm>
#include <array>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_dispatch.hpp"
#include "cuda_memory.hpp"
#include "cuda_normalization.hpp"
#include "cuda_spatial.hpp"
#include "hpctrain/kernels/cuda/algorithm_choice.hpp"
#include "hpctrain/kernels/cuda/convolution_layout.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/cuda/launch_plan.hpp"
#include "hpctrain/kernels/math.hpp"
#include "hpctrain/kernels/spatial_taps.hpp"

namespace hpctrain::cuda {
namespace {

namespace km = kernel_math;
using GrowBuffer = DeviceScratch;  // grow-only; replaced blocks are retired, not freed (a graph may use them)

constexpr int conv_threads = 256;

unsigned conv_blocks(std::int64_t items) {
  return static_cast<unsigned>(std::clamp<std::int64_t>((items + conv_threads - 1) / conv_threads, 1, 65535));
}

template <class TS, class TD>
__global__ void convert_kernel(const TS* in, TD* out, std::int64_t count) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = store<TD>(load(in[i]));
}

// y[n][c][s] = bias[c] in y's dtype. 32-bit indices and precomputed divisors (below 2^31 elements; int64 beyond).
template <class T, class Index>
__global__ void broadcast_bias_kernel(const float* bias, T* y, Index count, Index channels, Index spatial,
                                      km::FastDivisor by_spatial, km::FastDivisor by_channels) {
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index c;
    if constexpr (sizeof(Index) == 4) {
      const std::uint32_t plane = by_spatial.quotient(i);
      c = by_channels.remainder(plane, by_channels.quotient(plane));
    } else {
      c = i / spatial % channels;
    }
    y[i] = store<T>(bias[c]);
  }
}

template <class TS, class TD>
void convert(cudaStream_t stream, const void* in, void* out, std::int64_t count) {
  if (count == 0) return;
  convert_kernel<<<conv_blocks(count), conv_threads, 0, stream>>>(static_cast<const TS*>(in), static_cast<TD*>(out),
                                                                  count);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

enum class Pass : std::uint8_t { forward, backward_data, backward_weights };

struct Key {
  SpatialGeometry geometry;
  std::int64_t rows = 0;
  DType dtype = DType::f32;
  Pass pass = Pass::forward;
  bool bias = false;  // forward: with a bias (the plan then prefers the algorithm the fused bias needs)
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& key) const {
    std::size_t hash = 0;
    spatial::hash_geometry(hash, key.geometry);
    const auto mix = [&hash](std::int64_t value) {
      hash ^= static_cast<std::size_t>(value) + 0x9e3779b97f4a7c15ull + (hash << 6) + (hash >> 2);
    };
    mix(key.rows);
    mix(static_cast<std::int64_t>(key.dtype) | static_cast<std::int64_t>(key.pass) << 4 |
        static_cast<std::int64_t>(key.bias) << 8);
    return hash;
  }
};

cudnnDataType_t cudnn_type(DType type) {
  switch (type) {
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    case DType::f16:
      return CUDNN_DATA_HALF;
    default:
      return CUDNN_DATA_FLOAT;
  }
}

// Descriptors and the chosen algorithm of one (geometry, rows, dtype, pass).
struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t convolution = nullptr;
  bool widened = false;     // runs in fp32 on widened copies of 16-bit operands
  bool mixed = false;       // weight gradient: 16-bit x and dy, fp32 filter gradient
  bool fused_bias = false;  // forward: the bias in cudnnConvolutionBiasActivationForward (IMPLICIT_PRECOMP_GEMM)
  cudnnTensorDescriptor_t bias = nullptr;  // (1, C, 1, 1[, 1]) in the data's dtype, with fused_bias
  cudnnConvolutionFwdAlgo_t forward_algorithm{};
  cudnnConvolutionBwdDataAlgo_t data_algorithm{};
  cudnnConvolutionBwdFilterAlgo_t filter_algorithm{};
  std::size_t workspace_bytes = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;  // the last heuristic call's
  AlgorithmChoice choice;                       // for the log
  int algorithm = 0;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (bias != nullptr) cudnnDestroyTensorDescriptor(bias);
    if (convolution != nullptr) cudnnDestroyConvolutionDescriptor(convolution);
  }
};

void set_tensor(cudnnTensorDescriptor_t descriptor, cudnnDataType_t type, std::int64_t rows, std::int64_t channels,
                const std::array<std::int64_t, 3>& spatial, int dimensions, SpatialLayout layout) {
  int dims[5] = {static_cast<int>(rows), static_cast<int>(channels), 1, 1, 1};
  for (int axis = 0; axis < dimensions; ++axis)
    dims[2 + axis] = static_cast<int>(spatial[static_cast<std::size_t>(axis)]);
  if (layout == SpatialLayout::channels_first) {
    HPCTRAIN_CUDNN_CHECK(cudnnSetTensorNdDescriptorEx(descriptor, CUDNN_TENSOR_NCHW, type, 2 + dimensions, dims));
    return;
  }
  // Channels-last: the same N, C, D, H, W dimensions, C fastest (cuda/convolution_layout.hpp).
  const std::array<std::int64_t, 5> wide = tensor_strides(layout, channels, spatial, dimensions);
  int strides[5];
  for (std::size_t i = 0; i < 5; ++i) strides[i] = static_cast<int>(wide[i]);
  HPCTRAIN_CUDNN_CHECK(cudnnSetTensorNdDescriptor(descriptor, type, 2 + dimensions, dims, strides));
}

// Whether an algorithm's math keeps the storage's precision: fp32 data must not go through TF32 (unless it holds
// widened 16-bit values, exact in TF32), and no configuration may be down-converted to fp16.
// The heuristic's answer: false (remembered in the plan for the error message) when cuDNN refuses the configuration,
// e.g. a 16-bit one it has no kernels for; the caller then tries fp32.
bool heuristic(cudnnStatus_t status, Plan& plan) {
  plan.status = status;
  return status == CUDNN_STATUS_SUCCESS;
}

bool acceptable_math(cudnnMathType_t math, bool strict_fp32) {
  if (math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  return !strict_fp32 || math == CUDNN_FMA_MATH || math == CUDNN_DEFAULT_MATH;
}

// The heuristic's results as candidates for choose_algorithm (kernels/cuda/algorithm_choice.hpp).
// preferred >= 0: that algorithm when it gives up nothing (choose_algorithm_preferring).
template <class Perf>
PreferredChoice choose(const std::vector<Perf>& results, int count, bool strict_fp32, std::size_t cap, int preferred) {
  std::vector<AlgorithmCandidate> candidates;
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[static_cast<std::size_t>(i)];
    candidates.push_back({static_cast<int>(r.algo), r.status == CUDNN_STATUS_SUCCESS,
                          acceptable_math(r.mathType, strict_fp32), r.determinism == CUDNN_DETERMINISTIC, r.memory});
  }
  if (preferred < 0) return {choose_algorithm(candidates, cap), false};
  return choose_algorithm_preferring(candidates, cap, preferred);
}

const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::forward:
      return "forward";
    case Pass::backward_data:
      return "data gradient";
    case Pass::backward_weights:
      return "weight gradient";
  }
  return "?";
}

}  // namespace

struct CudaConvolution::Impl {
  cudaStream_t stream;
  cudnnHandle_t handle = nullptr;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;
  GrowBuffer workspace;
  GrowBuffer wide_a, wide_b, wide_out;  // fp32 copies of 16-bit operands and the fp32 result
  GrowBuffer staged_weights;            // weights (or their gradient) at an address cuDNN surely accepts
  GrowBuffer partials;                  // bias-gradient partial sums
  bool allow_tf32 = false;              // precision.tf32: tensor-core math for f32 data too
  std::vector<std::string> notes;       // algorithm choices since the last take_notes()
  std::mutex mutex;

  explicit Impl(cudaStream_t s) : stream(s) {}
  ~Impl() {
    plans.clear();
    if (identity != nullptr) cudnnDestroyActivationDescriptor(identity);
    if (handle != nullptr) cudnnDestroy(handle);
  }

  // The cached plan of `key`, made on first use. widened: replace a 16-bit plan by one on widened fp32 copies (after
  // cuDNN refused to run the 16-bit algorithm its heuristic offered).
  Plan& plan(const Key& key, bool widened = false);
  // Builds the plan's descriptors for data of `type` (filter of `filter_type`: the weight gradient's may be fp32 for
  // 16-bit data); false when cuDNN offers no acceptable algorithm.
  bool try_plan(const Key& key, DType type, DType filter_type, bool strict_fp32, Plan& plan);
  cudnnActivationDescriptor_t identity = nullptr;  // the fused bias's activation
  GrowBuffer bias_copy;                            // the fp32 bias in the data's dtype, for the fused bias
};

bool CudaConvolution::Impl::try_plan(const Key& key, DType type, DType filter_type, bool strict_fp32, Plan& p) {
  const SpatialGeometry& g = key.geometry;
  const cudnnDataType_t data = cudnn_type(type);
  set_tensor(p.x, data, key.rows, g.in_channels, g.input, g.dimensions, g.layout);
  set_tensor(p.y, data, key.rows, g.out_channels, g.output, g.dimensions, g.layout);
  p.fused_bias = false;
  int filter[5] = {static_cast<int>(g.out_channels), static_cast<int>(g.in_channels / g.groups), 1, 1, 1};
  int pad[3], stride[3], dilation[3];
  for (int axis = 0; axis < g.dimensions; ++axis) {
    const auto a = static_cast<std::size_t>(axis);
    filter[2 + axis] = static_cast<int>(g.kernel[a]);
    pad[axis] = static_cast<int>(g.padding[a]);
    stride[axis] = static_cast<int>(g.stride[a]);
    dilation[axis] = static_cast<int>(g.dilation[a]);
  }
  // Dimensions in K, C, spatial order; channels-last data takes K, spatial, C filters (the weights transposed).
  const cudnnTensorFormat_t filter_format =
      g.layout == SpatialLayout::channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  HPCTRAIN_CUDNN_CHECK(
      cudnnSetFilterNdDescriptor(p.w, cudnn_type(filter_type), filter_format, 2 + g.dimensions, filter));
  HPCTRAIN_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(p.convolution, g.dimensions, pad, stride, dilation,
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  HPCTRAIN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(p.convolution, static_cast<int>(g.groups)));
  HPCTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(p.convolution, strict_fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  constexpr int wanted = 16;
  int count = 0, chosen = -1;
  std::size_t free_bytes = 0, total_bytes = 0;
  HPCTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::size_t cap = convolution_workspace_cap(free_bytes);
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  switch (key.pass) {
    case Pass::forward: {
      std::vector<cudnnConvolutionFwdAlgoPerf_t> results(wanted);
      if (!heuristic(cudnnGetConvolutionForwardAlgorithm_v7(handle, p.x, p.w, p.convolution, p.y, wanted, &count,
                                                            results.data()),
                     p))
        return false;
      // With a bias: IMPLICIT_PRECOMP_GEMM when offered usable (the fused bias needs it), else the usual choice.
      const PreferredChoice preferred =
          choose(results, count, strict_fp32, cap, key.bias ? CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM : -1);
      p.choice = preferred.choice;
      p.fused_bias = preferred.preferred_taken;
      chosen = p.choice.index;
      if (chosen < 0) return false;
      p.forward_algorithm = results[static_cast<std::size_t>(chosen)].algo;
      p.algorithm = static_cast<int>(p.forward_algorithm);
      math = results[static_cast<std::size_t>(chosen)].mathType;
      break;
    }
    case Pass::backward_data: {
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> results(wanted);
      if (!heuristic(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, p.w, p.y, p.convolution, p.x, wanted, &count,
                                                                 results.data()),
                     p))
        return false;
      p.choice = choose(results, count, strict_fp32, cap, -1).choice;
      chosen = p.choice.index;
      if (chosen < 0) return false;
      p.data_algorithm = results[static_cast<std::size_t>(chosen)].algo;
      p.algorithm = static_cast<int>(p.data_algorithm);
      math = results[static_cast<std::size_t>(chosen)].mathType;
      break;
    }
    case Pass::backward_weights: {
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> results(wanted);
      if (!heuristic(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, p.x, p.y, p.convolution, p.w, wanted, &count,
                                                                   results.data()),
                     p))
        return false;
      p.choice = choose(results, count, strict_fp32, cap, -1).choice;
      chosen = p.choice.index;
      if (chosen < 0) return false;
      p.filter_algorithm = results[static_cast<std::size_t>(chosen)].algo;
      p.algorithm = static_cast<int>(p.filter_algorithm);
      math = results[static_cast<std::size_t>(chosen)].mathType;
      break;
    }
  }
  if (strict_fp32) math = CUDNN_FMA_MATH;
  HPCTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(p.convolution, math));
  if (p.fused_bias) {
    if (p.bias == nullptr) HPCTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.bias));
    const std::array<std::int64_t, 3> ones{1, 1, 1};
    set_tensor(p.bias, data, 1, g.out_channels, ones, g.dimensions, SpatialLayout::channels_first);
  }
  switch (key.pass) {
    case Pass::forward:
      HPCTRAIN_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, p.x, p.w, p.convolution, p.y,
                                                                   p.forward_algorithm, &p.workspace_bytes));
      break;
    case Pass::backward_data:
      HPCTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(handle, p.w, p.y, p.convolution, p.x,
                                                                        p.data_algorithm, &p.workspace_bytes));
      break;
    case Pass::backward_weights:
      HPCTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, p.x, p.y, p.convolution, p.w,
                                                                          p.filter_algorithm, &p.workspace_bytes));
      break;
  }
  return true;
}

Plan& CudaConvolution::Impl::plan(const Key& key, bool widened) {
  const auto found = plans.find(key);
  if (found != plans.end() && (found->second->widened || !widened)) return *found->second;
  if (handle == nullptr) {  // created on the first convolution, so runs without one never load cuDNN
    HPCTRAIN_CUDNN_CHECK(cudnnCreate(&handle));
    HPCTRAIN_CUDNN_CHECK(cudnnSetStream(handle, stream));
  }
  auto created = std::make_unique<Plan>();
  HPCTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&created->x));
  HPCTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&created->y));
  HPCTRAIN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&created->w));
  HPCTRAIN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&created->convolution));
  const bool sixteen_bit = key.dtype != DType::f32;
  // Weight gradients of 16-bit data: 16-bit x and dy into an fp32 filter gradient where cuDNN has an algorithm for
  // the mix (cuda/convolution_layout.hpp), otherwise fp32 on widened inputs (exact in TF32, so tensor ops are
  // allowed). cuDNN's all-16-bit weight gradient is never used: it would round the gradient to 16 bits.
  const bool weights = key.pass == Pass::backward_weights;
  created->widened = sixteen_bit && (widened || (weights && !mixed_weight_gradient(key.dtype)));
  created->mixed = sixteen_bit && weights && !created->widened;
  // f32 data keeps fp32 math (FMA) unless precision.tf32 allows tensor cores.
  bool found_algorithm = created->widened ? try_plan(key, DType::f32, DType::f32, false, *created)
                                          : try_plan(key, key.dtype, created->mixed ? DType::f32 : key.dtype,
                                                     !sixteen_bit && !allow_tf32, *created);
  if (!found_algorithm && sixteen_bit && !created->widened) {
    created->widened = true;
    created->mixed = false;
    found_algorithm = try_plan(key, DType::f32, DType::f32, false, *created);
  }
  if (!found_algorithm) {
    const SpatialGeometry& g = key.geometry;
    std::ostringstream detail;
    detail << "no algorithm for a " << g.dimensions << "-D convolution (pass " << static_cast<int>(key.pass) << ") of "
           << key.rows << " samples, " << g.in_channels << " -> " << g.out_channels << " channels, " << g.groups
           << " groups, " << dtype_name(key.dtype) << " (" << cudnnGetErrorString(created->status) << ")";
    throw LibraryError("cuDNN", "cudnnGetConvolution*Algorithm_v7", detail.str(), __FILE__, __LINE__);
  }
  workspace.reserve(created->workspace_bytes);  // grow-only: the first call of a plan (warm-up)
  {
    const SpatialGeometry& g = key.geometry;
    std::ostringstream note;
    note << "cuDNN " << g.dimensions << "-D convolution " << g.in_channels << " -> " << g.out_channels << " ("
         << key.rows << " samples, " << dtype_name(key.dtype) << (created->widened ? " widened to f32" : "")
         << (created->mixed ? " into an f32 gradient" : "")
         << (g.layout == SpatialLayout::channels_last ? ", channels-last" : "")
         << (created->fused_bias ? ", bias fused" : "") << ") " << pass_name(key.pass) << ": algorithm "
         << created->algorithm << ", workspace " << created->workspace_bytes / 1024 << " KiB, "
         << (created->choice.deterministic ? "deterministic" : "NOT deterministic (results may differ run to run)");
    if (created->choice.deterministic_over_cap) note << "; a deterministic one wanted more workspace than the cap";
    notes.push_back(note.str());
  }
  if (found != plans.end()) {
    found->second = std::move(created);
    return *found->second;
  }
  return *plans.emplace(key, std::move(created)).first->second;
}

CudaConvolution::CudaConvolution(cudaStream_t stream) : impl_(std::make_unique<Impl>(stream)) {}
CudaConvolution::~CudaConvolution() = default;

std::size_t CudaConvolution::cached_plans() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->plans.size();
}

std::vector<std::string> CudaConvolution::take_notes() {
  const std::lock_guard lock(impl_->mutex);
  return std::exchange(impl_->notes, {});
}

void CudaConvolution::allow_tf32(bool allowed) {
  const std::lock_guard lock(impl_->mutex);
  if (impl_->allow_tf32 == allowed) return;
  impl_->allow_tf32 = allowed;
  impl_->plans.clear();  // chosen with the other math
}

namespace {

bool aligned(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// An fp32 copy of 16-bit data in `buffer`.
template <class T>
const float* widen(cudaStream_t stream, GrowBuffer& buffer, const void* data, std::int64_t count) {
  auto* wide = static_cast<float*>(buffer.reserve(static_cast<std::size_t>(count) * sizeof(float)));
  convert<T, float>(stream, data, wide, count);
  return wide;
}

// A copy of `bytes` at `data` in `buffer` (256-byte aligned).
const void* stage(cudaStream_t stream, GrowBuffer& buffer, const void* data, std::size_t bytes) {
  void* staged = buffer.reserve(bytes);
  HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(staged, data, bytes, cudaMemcpyDeviceToDevice, stream));
  return staged;
}

// y = bias per channel in y's dtype and layout. The channels-last index's channel is index % channels: a "plane" of
// one position holding every channel.
template <class T>
void broadcast_bias(cudaStream_t stream, const float* bias, T* y, const SpatialGeometry& g, std::int64_t count) {
  const bool last = g.layout == SpatialLayout::channels_last;
  const std::int64_t inner = last ? 1 : g.output_size();  // elements per channel run
  if (fits_32bit_indexing(count)) {
    broadcast_bias_kernel<T, std::uint32_t><<<conv_blocks(count), conv_threads, 0, stream>>>(
        bias, y, static_cast<std::uint32_t>(count), static_cast<std::uint32_t>(g.out_channels),
        static_cast<std::uint32_t>(inner), km::FastDivisor(static_cast<std::uint32_t>(inner)),
        km::FastDivisor(static_cast<std::uint32_t>(g.out_channels)));
  } else {
    broadcast_bias_kernel<T, std::int64_t><<<conv_blocks(count), conv_threads, 0, stream>>>(
        bias, y, count, g.out_channels, inner, km::FastDivisor(), km::FastDivisor());
  }
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

// The weights as cuDNN reads them: channels-last plans take (K, kernel positions, C / groups) filters, transposed from
// PyTorch's (K, C / groups, kernel positions) into `buffer`; channels-first ones PyTorch's, staged when misaligned.
const void* filter_of(cudaStream_t stream, GrowBuffer& buffer, const SpatialGeometry& g, const TensorView& weight) {
  if (g.layout == SpatialLayout::channels_last) {
    void* transposed = buffer.reserve(weight.bytes());
    transpose_rows(stream, g.out_channels, g.in_channels / g.groups, g.kernel_size(), weight.dtype, weight.data,
                   transposed);
    return transposed;
  }
  return aligned(weight.data) ? weight.data : stage(stream, buffer, weight.data, weight.bytes());
}

// cuDNN's answers that mean "not this configuration" (as opposed to a failure): a fused or mixed-precision call
// refused at run time, retried the plain way.
bool refused(cudnnStatus_t status) { return status == CUDNN_STATUS_NOT_SUPPORTED || status == CUDNN_STATUS_BAD_PARAM; }

}  // namespace

void CudaConvolution::forward(const SpatialGeometry& g, const TensorView& x, const TensorView& weight, const void* bias,
                              const TensorView& y) {
  spatial::check_convolution(g, x, y, weight, "convolution_forward");
  HPCTRAIN_ASSERT(weight.dtype == x.dtype, "convolution_forward: weights of another dtype");
  require_device_storage(x.dtype, "convolution_forward");
  if (x.rows == 0) return;
  Impl& s = *impl_;
  const std::lock_guard lock(s.mutex);
  const Key key{g, x.rows, x.dtype, Pass::forward, bias != nullptr};
  dispatch_storage(x.dtype, "convolution_forward", [&]<class T>() {
    const auto attempt = [&](Plan& p) {
      const void* source = x.data;
      const void* weights = filter_of(s.stream, s.staged_weights, g, weight);
      void* out = y.data;
      if (p.widened) {
        source = widen<T>(s.stream, s.wide_a, x.data, x.size());
        weights = widen<T>(s.stream, s.wide_b, weights, weight.size());
        out = s.wide_out.reserve(static_cast<std::size_t>(y.size()) * sizeof(float));
      }
      const float alpha = 1.0f;
      void* workspace = s.workspace.reserve(p.workspace_bytes);
      cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
      if (bias != nullptr && p.fused_bias) {
        // y = conv(x) + bias in one call (identity activation, IMPLICIT_PRECOMP_GEMM; z = y weighted 0). The bias
        // in the data's dtype, as the broadcast path rounds it.
        if (s.identity == nullptr) {
          HPCTRAIN_CUDNN_CHECK(cudnnCreateActivationDescriptor(&s.identity));
          HPCTRAIN_CUDNN_CHECK(
              cudnnSetActivationDescriptor(s.identity, CUDNN_ACTIVATION_IDENTITY, CUDNN_NOT_PROPAGATE_NAN, 0.0));
        }
        const void* bias_data = bias;
        if (!p.widened && x.dtype != DType::f32) {
          void* converted = s.bias_copy.reserve(static_cast<std::size_t>(g.out_channels) * sizeof(T));
          convert<float, T>(s.stream, bias, converted, g.out_channels);
          bias_data = converted;
        }
        const float zero = 0.0f;
        status = cudnnConvolutionBiasActivationForward(s.handle, &alpha, p.x, source, p.w, weights, p.convolution,
                                                       p.forward_algorithm, workspace, p.workspace_bytes, &zero, p.y,
                                                       out, p.bias, bias_data, s.identity, p.y, out);
        if (refused(status)) {
          p.fused_bias = false;  // from now on the broadcast bias below
          s.notes.push_back("cuDNN refused the convolution with its bias fused (" +
                            std::string(cudnnGetErrorString(status)) + "): the bias is broadcast first");
        }
      }
      if (bias == nullptr || !p.fused_bias) {
        const float beta = bias != nullptr ? 1.0f : 0.0f;
        if (bias != nullptr) {
          if (p.widened)
            broadcast_bias(s.stream, static_cast<const float*>(bias), static_cast<float*>(out), g, y.size());
          else
            broadcast_bias(s.stream, static_cast<const float*>(bias), static_cast<T*>(out), g, y.size());
        }
        status = cudnnConvolutionForward(s.handle, &alpha, p.x, source, p.w, weights, p.convolution,
                                         p.forward_algorithm, workspace, p.workspace_bytes, &beta, p.y, out);
      }
      if (status == CUDNN_STATUS_SUCCESS && p.widened) convert<float, T>(s.stream, out, y.data, y.size());
      return status;
    };
    Plan& p = s.plan(key);
    cudnnStatus_t status = attempt(p);
    if (status == CUDNN_STATUS_NOT_SUPPORTED && !p.widened && x.dtype != DType::f32)
      status = attempt(s.plan(key, true));
    HPCTRAIN_CUDNN_CHECK(status);
  });
}

void CudaConvolution::backward_data(const SpatialGeometry& g, const TensorView& dy, const TensorView& weight,
                                    const TensorView& dx) {
  spatial::check_convolution(g, dx, dy, weight, "convolution_backward_data");
  HPCTRAIN_ASSERT(weight.dtype == dy.dtype, "convolution_backward_data: weights of another dtype");
  require_device_storage(dy.dtype, "convolution_backward_data");
  if (dy.rows == 0) return;
  Impl& s = *impl_;
  const std::lock_guard lock(s.mutex);
  const Key key{g, dy.rows, dy.dtype, Pass::backward_data};
  dispatch_storage(dy.dtype, "convolution_backward_data", [&]<class T>() {
    const auto attempt = [&](const Plan& p) {
      const void* gradient = dy.data;
      const void* weights = filter_of(s.stream, s.staged_weights, g, weight);
      void* out = dx.data;
      if (p.widened) {
        gradient = widen<T>(s.stream, s.wide_a, dy.data, dy.size());
        weights = widen<T>(s.stream, s.wide_b, weights, weight.size());
        out = s.wide_out.reserve(static_cast<std::size_t>(dx.size()) * sizeof(float));
      }
      const float alpha = 1.0f, beta = 0.0f;
      const cudnnStatus_t status =
          cudnnConvolutionBackwardData(s.handle, &alpha, p.w, weights, p.y, gradient, p.convolution, p.data_algorithm,
                                       s.workspace.reserve(p.workspace_bytes), p.workspace_bytes, &beta, p.x, out);
      if (status == CUDNN_STATUS_SUCCESS && p.widened) convert<float, T>(s.stream, out, dx.data, dx.size());
      return status;
    };
    const Plan& p = s.plan(key);
    cudnnStatus_t status = attempt(p);
    if (status == CUDNN_STATUS_NOT_SUPPORTED && !p.widened && dy.dtype != DType::f32)
      status = attempt(s.plan(key, true));
    HPCTRAIN_CUDNN_CHECK(status);
  });
}

void CudaConvolution::backward_weights(const SpatialGeometry& g, const TensorView& x, const TensorView& dy,
                                       const TensorView& dweight, void* dbias, bool accumulate) {
  spatial::check_convolution(g, x, dy, dweight, "convolution_backward_weights");
  require_device_storage(x.dtype, "convolution_backward_weights");
  HPCTRAIN_ASSERT(dweight.dtype == DType::f32, "convolution_backward_weights: gradients are f32");
  const bool last = g.layout == SpatialLayout::channels_last;
  HPCTRAIN_ASSERT(!last || dbias == nullptr,
                  "convolution_backward_weights: the channels-last bias gradient is the backend's column sums");
  Impl& s = *impl_;
  if (x.rows == 0) {
    if (!accumulate) {
      HPCTRAIN_CUDA_CHECK(cudaMemsetAsync(dweight.data, 0, dweight.bytes(), s.stream));
      if (dbias != nullptr)
        HPCTRAIN_CUDA_CHECK(
            cudaMemsetAsync(dbias, 0, static_cast<std::size_t>(g.out_channels) * sizeof(float), s.stream));
    }
    return;
  }
  const std::lock_guard lock(s.mutex);
  const Key key{g, x.rows, x.dtype, Pass::backward_weights};
  if (dbias != nullptr)
    channel_sums(s.stream, s.partials, x.rows, g.out_channels, dy, static_cast<float*>(dbias), accumulate);
  // Channels-last: cuDNN's (K, kernel positions, C / groups) gradient into staging, transposed (and added) into
  // PyTorch's layout after. Channels-first: in place unless misaligned.
  void* out = dweight.data;
  const bool staged = last || !aligned(out);
  if (staged) {
    out = s.staged_weights.reserve(dweight.bytes());
    if (accumulate && !last)
      HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(out, dweight.data, dweight.bytes(), cudaMemcpyDeviceToDevice, s.stream));
  }
  const float alpha = 1.0f, beta = accumulate && !last ? 1.0f : 0.0f;
  const auto attempt = [&](const Plan& p) {
    const void* source = x.data;
    const void* gradient = dy.data;
    dispatch_storage(x.dtype, "convolution_backward_weights", [&]<class T>() {
      if (p.widened) {
        source = widen<T>(s.stream, s.wide_a, x.data, x.size());
        gradient = widen<T>(s.stream, s.wide_b, dy.data, dy.size());
      }
    });
    return cudnnConvolutionBackwardFilter(s.handle, &alpha, p.x, source, p.y, gradient, p.convolution,
                                          p.filter_algorithm, s.workspace.reserve(p.workspace_bytes), p.workspace_bytes,
                                          &beta, p.w, out);
  };
  const Plan& p = s.plan(key);
  cudnnStatus_t status = attempt(p);
  // A 16-bit-input, fp32-output weight gradient cuDNN offered but will not run: the widened plan from now on.
  if (refused(status) && p.mixed) status = attempt(s.plan(key, true));
  HPCTRAIN_CUDNN_CHECK(status);
  if (last)
    transpose_rows(s.stream, g.out_channels, g.kernel_size(), g.in_channels / g.groups, DType::f32, out, dweight.data,
                   accumulate);
  else if (staged)
    HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(dweight.data, out, dweight.bytes(), cudaMemcpyDeviceToDevice, s.stream));
}

}  // namespace hpctrain::cuda
