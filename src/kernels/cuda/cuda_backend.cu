// The CUDA backend: one compute stream, and the classes and kernels it calls, one concern per file:
//   cuda_memory      device scratch (grow-only, retiring), polling host waits, the pinned ring, batch uploads on a
//                    copy stream
//   cuda_elementwise casts, activations, dropout
//   cuda_rows        layernorm and the losses (a warp per row), bias gradients (two-pass column sums)
//   cuda_normalization  segmented layer/group normalisation and per-channel sums (2-D grids, fixed order)
//   cuda_optimizer   gradient statistics, AdamW/SGD, loss scaler, step bookkeeping
//   cuda_gemm        cuBLASLt products (bias and bias-gradient epilogues)
//   cuda_convolution cuDNN convolutions;  cuda_spatial  pooling and groupnorm entry points
//   cuda_timeline    --profile phases on CUDA events and NVTX ranges
//   cuda_attention   fused attention (the reference: fp32 FMAs), the embedding lookup, sequence pooling
//   tensor_core_attention  fused attention on tensor cores (bf16/fp16; HPCTRAIN_CUDA_ATTENTION=tensor_core)
//   cuda_cached_attention  one-query attention over the key/value cache (hpctrain generate)
//   cuda_to_sequence a conv feature map as a sequence (a vision transformer's patch tokens)
//   cuda_class_hits  evaluation's argmax and top-5 hits, predict's per-row scores (a warp per row)
// The kernels are thin loops around the HPCTRAIN_HD arithmetic of kernels/math.hpp, so they compute the CPU backend's
// formulas (tests/gpu/cuda_kernels_test.cpp compares the two on the same inputs).
//
// - Storage f32/bf16/f16 with fp32 arithmetic; f64 (CPU gradient checks only) is NotSupported.
// - Scalars that change per step (loss scale, learning rate, skip flag, gradient scale) are read by the kernels from
//   device memory, so a step needs no host synchronisation and can be captured in a CUDA graph.
// - Memory is allocated at set-up; scratch grows only on a first larger call and never frees a block a captured graph
//   may use (it retires it). The host never blocks in a plain synchronisation: it polls and calls the wait monitor
//   (NCCL's error check) in between.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_attention.hpp"
#include "cuda_cached_attention.hpp"
#include "cuda_class_hits.hpp"
#include "cuda_dispatch.hpp"
#include "cuda_elementwise.hpp"
#include "cuda_gemm.hpp"
#include "cuda_memory.hpp"
#include "cuda_optimizer.hpp"
#include "cuda_rows.hpp"
#include "cuda_spatial.hpp"
#include "cuda_timeline.hpp"
#include "cuda_to_sequence.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda/attention_plan.hpp"
#include "hpctrain/kernels/cuda/convolution_layout.hpp"
#include "hpctrain/kernels/cuda/cuda_backend.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/cuda/linear_epilogue.hpp"
#include "hpctrain/kernels/math.hpp"
#include "tensor_core_attention.hpp"

namespace hpctrain {
namespace {

namespace km = kernel_math;
using cuda::dispatch_storage;

// Parameter tensors start at multiples of this in the flat buffers: what cuBLASLt's and cuDNN's fastest algorithms
// assume, so no weight is staged through an aligned copy (Model pads the offsets).
constexpr std::size_t parameter_alignment_bytes = 256;

void check_same_shape(const TensorView& a, const TensorView& b, const char* what) {
  HPCTRAIN_ASSERT(a.rows == b.rows && a.cols == b.cols && a.dtype == b.dtype,
                  what << ": shapes/dtypes differ: " << a.rows << "x" << a.cols << " " << dtype_name(a.dtype) << " vs "
                       << b.rows << "x" << b.cols << " " << dtype_name(b.dtype));
}

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
    std::memcpy(uuid_.data(), properties.uuid.bytes, uuid_.size());
    compute_major_ = properties.major;
    attention_kernel_ = cuda::parse_attention_kernel(std::getenv(cuda::attention_kernel_variable));
    if (attention_kernel_ == cuda::AttentionKernel::tensor_core)  // the run's log says which kernels it asked for
      name_ += ", attention on tensor cores";
    HPCTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&wait_event_, cudaEventDisableTiming));
    gemm_ = std::make_unique<cuda::CudaGemm>(stream_, false);
#if defined(HPCTRAIN_HAVE_CUDNN)
    convolution_ = std::make_unique<cuda::CudaConvolution>(stream_);
#endif
    ring_ = std::make_unique<cuda::PinnedRing>(std::size_t{32} << 20);
    uploads_ = std::make_unique<cuda::UploadQueue>(stream_, *ring_);
    timeline_ = std::make_unique<cuda::PhaseTimeline>(stream_);
    // Typical sizes, so that a normal run rarely grows them inside a step.
    bias_scratch_.reserve(std::size_t{4} << 16);
    rows_.row_results.reserve(std::size_t{16} << 16);
  }
  ~CudaBackend() override {
    if (capturing_) {  // left by an exception during capture: end it so the stream can be destroyed
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial != nullptr) cudaGraphDestroy(partial);
      (void)cudaGetLastError();
    }
    release_graphs();
    HPCTRAIN_CUDA_WARN(cudaStreamSynchronize(stream_));
    timeline_.reset();
    uploads_.reset();
    ring_.reset();
    gemm_.reset();
#if defined(HPCTRAIN_HAVE_CUDNN)
    convolution_.reset();
#endif
    HPCTRAIN_CUDA_WARN(cudaEventDestroy(wait_event_));
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
  // The source may be reused as soon as this returns. Up to a quarter of the pinned ring goes through it without
  // waiting for the stream; larger copies (set-up, checkpoint loads) go directly and wait (polling).
  void copy_to_backend(void* destination, const void* host_source, std::size_t bytes) override {
    if (bytes == 0) return;
    if (bytes <= ring_->capacity() / 4) {
      ring_->upload(destination, host_source, bytes, stream_, monitor_);
    } else {
      HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination, host_source, bytes, cudaMemcpyHostToDevice, stream_));
      wait();  // the source must stay valid until the copy ran
    }
  }
  void copy_to_host(void* host_destination, const void* source, std::size_t bytes) override {
    if (bytes == 0) return;
    HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(host_destination, source, bytes, cudaMemcpyDeviceToHost, stream_));
    wait();
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
  void synchronize() override { wait(); }

  void set_wait_monitor(std::function<void()> monitor) override { monitor_ = std::move(monitor); }
  void upload_cast(const float* host_source, const TensorView& destination) override {
    uploads_->upload(host_source, destination, monitor_);
  }
  bool pin_host_memory(const void* pointer, std::size_t bytes) override { return uploads_->pin(pointer, bytes); }
  void unpin_host_memory(const void* pointer) override { uploads_->unpin(pointer); }

  // ---- conversions ----
  void cast(const TensorView& source, const TensorView& destination) override {
    HPCTRAIN_ASSERT(source.size() == destination.size(),
                    "cast: " << source.size() << " elements into " << destination.size());
    if (source.dtype == destination.dtype && source.dtype != DType::f64) {
      copy(destination.data, source.data, source.bytes());
      return;
    }
    cuda::cast(stream_, source, destination);
  }

  // ---- matrix products ----
  // cuBLASLt's bias has the output's dtype: the fp32 master bias converted into aligned scratch (null stays null).
  const void* output_bias(const void* bias, const TensorView& c) {
    if (bias == nullptr) return nullptr;
    cuda::require_device_storage(c.dtype, "gemm");
    void* scratch = bias_scratch_.reserve(static_cast<std::size_t>(c.cols) * dtype_size(c.dtype));
    cuda::cast_from_float(stream_, static_cast<const float*>(bias), c.cols, c.dtype, scratch);
    return scratch;
  }
  void gemm(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
            const void* bias, bool accumulate) override {
    gemm_->run(a, transpose_a, b, transpose_b, c, output_bias(bias, c), accumulate);
  }

  void bias_gradient(const TensorView& dy, void* dbias, DType master, bool accumulate) override {
    HPCTRAIN_ASSERT(master == DType::f32, "bias_gradient: master " << dtype_name(master) << " on the CUDA backend");
    cuda::require_device_storage(dy.dtype, "bias_gradient");
    cuda::bias_gradient(stream_, rows_, dy, static_cast<float*>(dbias), accumulate);
  }

  // The bias gradient in the weight-gradient product's epilogue when it can be (overwriting, aligned operands, an
  // algorithm for it); otherwise the two operations.
  void linear_weight_gradient(const TensorView& dy, const TensorView& x, const TensorView& dweight, void* dbias,
                              bool accumulate) override {
    if (dbias != nullptr && !accumulate && dweight.dtype == DType::f32 &&
        gemm_->run_with_bias_gradient(dy, x, dweight, dbias))
      return;
    Backend::linear_weight_gradient(dy, x, dweight, dbias, accumulate);
  }

  // The residual add as the product's C operand (beta = 1): cuBLASLt adds C before the bias epilogue, so the fp32
  // sum is (x W^T + skip) + bias, rounded once. Misaligned operands or no algorithm: the product and add().
  [[nodiscard]] bool fuses_residual_add(DType dtype) const override { return dtype != DType::f64; }
  void linear_residual_forward(const TensorView& x, const TensorView& weight, const void* bias, const TensorView& skip,
                               const TensorView& y) override {
    check_same_shape(skip, y, "linear_residual_forward");
    cuda::require_device_storage(y.dtype, "linear_residual_forward");
    if (gemm_->run_with_addend(x, weight, y, output_bias(bias, y), skip.data)) return;
    Backend::linear_residual_forward(x, weight, bias, skip, y);
  }

  // Linear + relu or gelu(tanh) in one product (cuda/linear_epilogue.hpp chooses the epilogue and what it leaves in
  // `pre`: relu's bit mask, gelu's input, or nothing). Misaligned operands or no algorithm: relu as the product into
  // y and relu in place (pre unwritten), gelu as the two operations. Which pre buffers hold a mask is remembered for
  // the backward (host state set in the forward's order, so a captured step replays the same choice).
  [[nodiscard]] bool fuses_linear_activation(Activation kind) const override { return cuda::folds_activation(kind); }
  void linear_activation_forward(const TensorView& x, const TensorView& weight, const void* bias, Activation kind,
                                 float alpha, const TensorView& pre, const TensorView& y) override {
    if (!fuses_linear_activation(kind)) return Backend::linear_activation_forward(x, weight, bias, kind, alpha, pre, y);
    check_same_shape(pre, y, "linear_activation_forward");
    const cuda::EpilogueChoice choice = cuda::linear_epilogue(kind, bias != nullptr, y.cols, dtype_size(y.dtype));
    folded_aux_.erase(pre.data);
    const void* converted_bias = output_bias(bias, y);
    if (choice.epilogue != cuda::LinearEpilogue::none) {
      HPCTRAIN_ASSERT(choice.aux_bytes_per_row * static_cast<std::size_t>(y.rows) <= pre.bytes(),
                      "linear_activation_forward: the epilogue's aux does not fit in the pre-activation");
      if (gemm_->run_activated(x, weight, y, converted_bias, gemm_epilogue(choice.epilogue),
                               choice.aux_ld > 0 ? pre.data : nullptr, choice.aux_ld)) {
        if (choice.aux_ld > 0) folded_aux_[pre.data] = {choice, y.rows, y.cols};
        return;
      }
      // No algorithm writes relu's mask here: relu in the epilogue without one (its backward then reads y).
      using E = cuda::CudaGemm::Epilogue;
      if (kind == Activation::relu && choice.aux_ld > 0 &&
          gemm_->run_activated(x, weight, y, converted_bias, bias != nullptr ? E::relu_bias : E::relu, nullptr, 0))
        return;
    }
    if (kind != Activation::relu) {
      gemm_->run(x, false, weight, true, pre, converted_bias, false);
      cuda::activation_forward(stream_, kind, alpha, pre, y);
      return;
    }
    gemm_->run(x, false, weight, true, y, converted_bias, false);
    cuda::activation_forward(stream_, kind, alpha, y, y);
  }
  // The activation's derivative in the product's epilogue (DRELU with the forward's mask, DGELU with its input) when
  // the forward of this pre buffer and shape left one; otherwise the product and the activation's backward kernel.
  void linear_activation_backward(const TensorView& dy, const TensorView& weight, Activation kind, float alpha,
                                  const TensorView& pre, const TensorView& y, const TensorView& dx) override {
    const auto found = folded_aux_.find(pre.data);
    if (found != folded_aux_.end() && found->second.rows == dx.rows && found->second.cols == dx.cols) {
      const cuda::ActivationGradientEpilogue epilogue =
          cuda::activation_gradient_epilogue(found->second.choice.epilogue);
      const bool matches = (epilogue == cuda::ActivationGradientEpilogue::drelu && kind == Activation::relu) ||
                           (epilogue == cuda::ActivationGradientEpilogue::dgelu && kind == Activation::gelu_tanh);
      using E = cuda::CudaGemm::Epilogue;
      if (matches && gemm_->run_with_activation_gradient(
                         dy, weight, dx, epilogue == cuda::ActivationGradientEpilogue::drelu ? E::drelu : E::dgelu,
                         pre.data, found->second.choice.aux_ld))
        return;
    }
    Backend::linear_activation_backward(dy, weight, kind, alpha, pre, y, dx);
  }
  static cuda::CudaGemm::Epilogue gemm_epilogue(cuda::LinearEpilogue epilogue) {
    using E = cuda::CudaGemm::Epilogue;
    switch (epilogue) {
      case cuda::LinearEpilogue::relu:
        return E::relu;
      case cuda::LinearEpilogue::relu_bias:
        return E::relu_bias;
      case cuda::LinearEpilogue::relu_aux:
        return E::relu_aux;
      case cuda::LinearEpilogue::relu_aux_bias:
        return E::relu_aux_bias;
      case cuda::LinearEpilogue::gelu_aux:
        return E::gelu_aux;
      case cuda::LinearEpilogue::gelu_aux_bias:
        return E::gelu_aux_bias;
      case cuda::LinearEpilogue::none:
        break;
    }
    return E::none;
  }

  // ---- element-wise ----
  void activation_forward(Activation kind, float alpha, const TensorView& x, const TensorView& y) override {
    check_same_shape(x, y, "activation_forward");
    cuda::activation_forward(stream_, kind, alpha, x, y);
  }

  void activation_backward(Activation kind, float alpha, const TensorView& x, const TensorView& dy,
                           const TensorView& dx) override {
    check_same_shape(x, dy, "activation_backward");
    check_same_shape(x, dx, "activation_backward");
    cuda::activation_backward(stream_, kind, alpha, x, dy, dx);
  }

  void add(const TensorView& a, const TensorView& b, const TensorView& sum) override {
    check_same_shape(a, b, "add");
    check_same_shape(a, sum, "add");
    cuda::add(stream_, a, b, sum);
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
    cuda::require_device_storage(x.dtype, "layernorm_forward");
    cuda::layernorm_forward(stream_, rows_, x, static_cast<const float*>(gamma), static_cast<const float*>(beta), eps,
                            y, static_cast<float*>(mean), static_cast<float*>(rstd));
  }

  void layernorm_backward(const TensorView& x, const TensorView& dy, const void* gamma, const void* mean,
                          const void* rstd, const TensorView& dx, void* dgamma, void* dbeta, bool accumulate) override {
    check_same_shape(x, dy, "layernorm_backward");
    check_same_shape(x, dx, "layernorm_backward");
    cuda::require_device_storage(x.dtype, "layernorm_backward");
    cuda::layernorm_backward(stream_, rows_, x, dy, static_cast<const float*>(gamma), static_cast<const float*>(mean),
                             static_cast<const float*>(rstd), dx, static_cast<float*>(dgamma),
                             static_cast<float*>(dbeta), accumulate);
  }

  // ---- convolutional networks (cuda_convolution.cu: cuDNN; cuda_spatial.cu: own kernels) ----
  // 16-bit models run their conv stacks channels-last (cuda/convolution_layout.hpp), fp32 ones channels-first; every
  // spatial operation takes both layouts.
  [[nodiscard]] SpatialLayout preferred_spatial_layout(DType activations) const override {
    return cuda::have_convolutions() ? cuda::convolution_layout(activations) : SpatialLayout::channels_first;
  }
  void convert_spatial_layout(std::int64_t channels, SpatialLayout from, const TensorView& x,
                              const TensorView& y) override {
    cuda::require_device_storage(x.dtype, "convert_spatial_layout");
    cuda::convert_spatial_layout(stream_, channels, from, x, y);
  }
#if defined(HPCTRAIN_HAVE_CUDNN)
  void convolution_forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& weight,
                           const void* bias, const TensorView& y) override {
    convolution_->forward(geometry, x, weight, bias, y);
  }
  void convolution_backward_data(const SpatialGeometry& geometry, const TensorView& dy, const TensorView& weight,
                                 const TensorView& dx) override {
    convolution_->backward_data(geometry, dy, weight, dx);
  }
  void convolution_backward_weights(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                                    const TensorView& dweight, void* dbias, bool accumulate) override {
    // Channels-last: the bias gradient is a column sum over (sample, position) rows of channels.
    if (geometry.layout == SpatialLayout::channels_last && dbias != nullptr && dy.rows > 0) {
      cuda::require_device_storage(dy.dtype, "convolution_backward_weights");
      cuda::channels_last_sums(stream_, rows_, dy, geometry.out_channels, static_cast<float*>(dbias), accumulate);
      dbias = nullptr;
    }
    convolution_->backward_weights(geometry, x, dy, dweight, dbias, accumulate);
  }
#endif
  void pooling_forward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x,
                       const TensorView& y) override {
    cuda::pooling_forward(stream_, kind, geometry, x, y);
  }
  void pooling_backward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                        const TensorView& dx) override {
    cuda::pooling_backward(stream_, kind, geometry, x, dy, dx);
  }
  void max_pooling_forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& y,
                           std::int32_t* argmax) override {
    cuda::pooling_forward(stream_, PoolingKind::max, geometry, x, y, argmax);
  }
  void max_pooling_backward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                            const std::int32_t* argmax, const TensorView& dx) override {
    cuda::pooling_backward(stream_, PoolingKind::max, geometry, x, dy, dx, argmax);
  }
  void groupnorm_forward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                         const void* gamma, const void* beta, float eps, const TensorView& y, void* mean,
                         void* rstd) override {
    cuda::require_device_storage(x.dtype, "groupnorm_forward");
    cuda::groupnorm_forward(stream_, rows_.partials, channels, groups, layout, x, static_cast<const float*>(gamma),
                            static_cast<const float*>(beta), eps, y, static_cast<float*>(mean),
                            static_cast<float*>(rstd));
  }
  void groupnorm_backward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                          const TensorView& dy, const void* gamma, const void* mean, const void* rstd,
                          const TensorView& dx, void* dgamma, void* dbeta, bool accumulate) override {
    cuda::require_device_storage(x.dtype, "groupnorm_backward");
    cuda::groupnorm_backward(stream_, rows_.partials, channels, groups, layout, x, dy, static_cast<const float*>(gamma),
                             static_cast<const float*>(mean), static_cast<const float*>(rstd), dx,
                             static_cast<float*>(dgamma), static_cast<float*>(dbeta), accumulate);
  }
  // Convolutions need cuDNN (a build without it keeps the NotSupported defaults and refuses spatial decks).
  [[nodiscard]] bool has_spatial_operations() const override { return cuda::have_convolutions(); }

  // ---- losses ----
  // Attention: the tensor-core kernels when HPCTRAIN_CUDA_ATTENTION=tensor_core and they cover the call (16-bit
  // storage, head_dim 32/64/128, no dropout, compute capability >= 8.0), else the reference kernels; both keep the
  // same contract, so a forward on one and its backward on the other agree.
  void attention_forward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out,
                         void* lse) override {
    if (tensor_core_attention(geometry, qkv.dtype, {qkv.data, out.data}))
      cuda::tensor_core_attention_forward(stream_, geometry, qkv, out, static_cast<float*>(lse));
    else
      cuda::attention_forward(stream_, geometry, qkv, out, static_cast<float*>(lse));
  }
  void attention_backward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out,
                          const TensorView& dout, const void* lse, const TensorView& dqkv) override {
    if (tensor_core_attention(geometry, qkv.dtype, {qkv.data, out.data, dout.data, dqkv.data}))
      cuda::tensor_core_attention_backward(stream_, sequence_scratch_, geometry, qkv, out, dout,
                                           static_cast<const float*>(lse), dqkv);
    else
      cuda::attention_backward(stream_, sequence_scratch_, geometry, qkv, out, dout, static_cast<const float*>(lse),
                               dqkv);
  }
  void cached_attention(const AttentionGeometry& geometry, const TensorView& qkv, void* cache, std::int64_t first,
                        const TensorView& out) override {
    cuda::cached_attention(stream_, geometry, qkv, cache, first, out);
  }
  void embedding_forward(const std::int32_t* ids, const void* table, std::int64_t vocabulary, const TensorView& y,
                         const void* positions, std::int64_t sequence) override {
    cuda::embedding_forward(stream_, ids, static_cast<const float*>(table), vocabulary, y,
                            static_cast<const float*>(positions), sequence);
  }
  void embedding_backward(const std::int32_t* ids, const TensorView& dy, std::int64_t vocabulary, void* dtable,
                          bool accumulate) override {
    cuda::embedding_backward(stream_, sequence_scratch_, ids, dy, vocabulary, static_cast<float*>(dtable), accumulate);
  }
  void sequence_pool_forward(SequencePooling mode, std::int64_t sequence, const TensorView& x,
                             const TensorView& y) override {
    cuda::sequence_pool_forward(stream_, mode, sequence, x, y);
  }
  void sequence_pool_backward(SequencePooling mode, std::int64_t sequence, const TensorView& dy,
                              const TensorView& dx) override {
    cuda::sequence_pool_backward(stream_, mode, sequence, dy, dx);
  }
  void to_sequence_forward(std::int64_t channels, SpatialLayout layout, const TensorView& x, const void* class_token,
                           const void* positions, const TensorView& y) override {
    cuda::to_sequence_forward(stream_, channels, layout, x, static_cast<const float*>(class_token),
                              static_cast<const float*>(positions), y);
  }
  void to_sequence_backward(std::int64_t channels, SpatialLayout layout, const TensorView& dy, const TensorView& dx,
                            void* dclass_token, void* dpositions, bool accumulate) override {
    cuda::to_sequence_backward(stream_, channels, layout, dy, dx, static_cast<float*>(dclass_token),
                               static_cast<float*>(dpositions), accumulate);
  }

  void softmax_cross_entropy(const TensorView& logits, const std::int32_t* labels, const float* grad_scale,
                             const TensorView& dlogits, LossSums* sums) override {
    if (dlogits.data != nullptr) check_same_shape(logits, dlogits, "softmax_cross_entropy");
    HPCTRAIN_ASSERT(logits.cols > 0 || logits.rows == 0, "softmax_cross_entropy: no classes");
    cuda::require_device_storage(logits.dtype, "softmax_cross_entropy");
    cuda::softmax_cross_entropy(stream_, rows_, logits, labels, grad_scale, dlogits, sums);
  }

  void smoothed_softmax_cross_entropy(const TensorView& logits, const std::int32_t* labels,
                                      const CrossEntropyOptions& options, const float* grad_scale,
                                      const TensorView& dlogits, LossSums* sums) override {
    if (dlogits.data != nullptr) check_same_shape(logits, dlogits, "smoothed_softmax_cross_entropy");
    HPCTRAIN_ASSERT(logits.cols > 0 || logits.rows == 0, "smoothed_softmax_cross_entropy: no classes");
    cuda::require_device_storage(logits.dtype, "smoothed_softmax_cross_entropy");
    cuda::smoothed_softmax_cross_entropy(stream_, rows_, logits, labels, options, grad_scale, dlogits, sums);
  }
  void count_class_hits(const TensorView& scores, const std::int32_t* targets, double* counts,
                        bool accumulate) override {
    cuda::count_class_hits(stream_, scores, targets, counts, accumulate);
  }
  void score_targets(const TensorView& logits, const std::int32_t* targets, std::int32_t* argmax,
                     float* target_log_probability) override {
    cuda::score_targets(stream_, logits, targets, argmax, target_log_probability);
  }
  void mean_squared_error(const TensorView& pred, const void* targets, const float* grad_scale, const TensorView& dpred,
                          LossSums* sums) override {
    if (dpred.data != nullptr) check_same_shape(pred, dpred, "mean_squared_error");
    HPCTRAIN_ASSERT(pred.cols > 0 || pred.rows == 0, "mean_squared_error: no columns");
    cuda::require_device_storage(pred.dtype, "mean_squared_error");
    cuda::mean_squared_error(stream_, rows_, pred, static_cast<const float*>(targets), grad_scale, dpred, sums);
  }

  // ---- optimizer and step bookkeeping ----
  void gradient_statistics(const float* gradients, std::int64_t count, const OptimizerHyper& hyper,
                           StepScalars* scalars) override {
    cuda::gradient_statistics(stream_, statistics_scratch_, gradients, count, hyper, scalars);
  }
  void optimizer_step(const OptimizerHyper& hyper, bool decay, float* parameters, const float* gradients, float* state1,
                      float* state2, std::int64_t count, const TensorView& working,
                      const StepScalars* scalars) override {
    cuda::optimizer_step(stream_, hyper, decay, parameters, gradients, state1, state2, count, working, scalars);
  }
  void finish_step(const LossScalerConfig& config, StepScalars* scalars) override {
    cuda::finish_step(stream_, config, scalars);
  }
  void loss_gradient_scale(const StepScalars* scalars, float rows, const float* label_weights,
                           float* grad_scale) override {
    cuda::loss_gradient_scale(stream_, scalars, rows, label_weights, grad_scale);
  }
  void copy_to_slot(void* base, std::size_t stride, const std::int32_t* slot, const void* source,
                    std::size_t bytes) override {
    cuda::copy_to_slot(stream_, base, stride, slot, source, bytes);
  }
  void copy_from_slot(void* destination, const void* base, std::size_t stride, const std::int32_t* slot,
                      std::size_t bytes) override {
    cuda::copy_from_slot(stream_, destination, base, stride, slot, bytes);
  }
  void advance_slot(std::int32_t* slot) override { cuda::advance_slot(stream_, slot); }

  // ---- graphs ----
  // Thread-local capture: the data loader's thread never calls CUDA, and this thread's own illegal calls during a
  // capture (a synchronisation, an allocation) fail loudly instead of corrupting the graph.
  void begin_capture(CaptureSlot slot) override {
    HPCTRAIN_ASSERT(!capturing_, "begin_capture: already capturing");
    HPCTRAIN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    capture_slot_ = slot;
  }
  void end_capture(CaptureSlot slot) override {
    HPCTRAIN_ASSERT(capturing_ && capture_slot_ == slot, "end_capture without begin_capture of that slot");
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    HPCTRAIN_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t& executable = graphs_[static_cast<std::size_t>(slot)];
    if (executable != nullptr) {
      HPCTRAIN_CUDA_CHECK(cudaGraphExecDestroy(executable));
      executable = nullptr;
    }
    const cudaError_t status = cudaGraphInstantiate(&executable, graph, 0);
    HPCTRAIN_CUDA_WARN(cudaGraphDestroy(graph));
    HPCTRAIN_CUDA_CHECK(status);
    // Uploads the graph's work descriptors now, so the first replay does not pay for it.
    HPCTRAIN_CUDA_CHECK(cudaGraphUpload(executable, stream_));
  }
  void replay_capture(CaptureSlot slot) override {
    cudaGraphExec_t executable = graphs_[static_cast<std::size_t>(slot)];
    HPCTRAIN_ASSERT(executable != nullptr, "replay_capture: nothing captured");
    HPCTRAIN_CUDA_CHECK(cudaGraphLaunch(executable, stream_));
  }
  [[nodiscard]] bool supports_capture() const override { return true; }
  [[nodiscard]] bool has_capture(CaptureSlot slot) const override {
    return graphs_[static_cast<std::size_t>(slot)] != nullptr;
  }
  void release_graphs() override {
    for (cudaGraphExec_t& executable : graphs_) {
      if (executable == nullptr) continue;
      HPCTRAIN_CUDA_WARN(cudaGraphExecDestroy(executable));
      executable = nullptr;
    }
  }

  // ---- timing, choices ----
  bool mark_phase(int phase, const char* name) override {
    timeline_->mark(phase, name);
    return true;
  }
  std::vector<double> phase_seconds() override { return timeline_->seconds(monitor_); }
  void allow_tf32(bool allowed) override {
    gemm_->allow_tf32(allowed);
#if defined(HPCTRAIN_HAVE_CUDNN)
    convolution_->allow_tf32(allowed);
#endif
  }
  [[nodiscard]] std::size_t parameter_alignment() const override { return parameter_alignment_bytes; }
  [[nodiscard]] DeviceUuid device_uuid() const override { return uuid_; }
  std::vector<std::string> take_notes() override {
#if defined(HPCTRAIN_HAVE_CUDNN)
    return convolution_->take_notes();
#else
    return {};
#endif
  }

 private:
  // Whether this attention call runs on the tensor-core kernels (cuda::choose_attention_kernel).
  [[nodiscard]] bool tensor_core_attention(const AttentionGeometry& g, DType dtype,
                                           std::initializer_list<const void*> buffers) const {
    cuda::AttentionCall call;
    call.dtype = dtype;
    call.head_dim = g.head_dim;
    call.batch = g.batch;
    call.heads = g.heads;
    call.sequence = g.sequence;
    call.dropout = cuda::attention_dropout_active(g);  // only the reference kernels have attention dropout
    call.compute_major = compute_major_;
    for (const void* buffer : buffers)
      call.buffers_aligned = call.buffers_aligned && reinterpret_cast<std::uintptr_t>(buffer) % 16 == 0;
    return cuda::choose_attention_kernel(attention_kernel_, call) == cuda::AttentionKernel::tensor_core;
  }

  // Everything queued so far has run (polling, so the wait monitor sees NCCL's errors).
  void wait() { cuda::wait_for_stream(stream_, wait_event_, monitor_); }

  void dropout(float p, std::uint64_t seed, std::uint32_t step, std::uint32_t layer, const std::int64_t* sample_ids,
               const TensorView& in, const TensorView& out, const char* what) {
    check_same_shape(in, out, what);
    HPCTRAIN_ASSERT(p >= 0.0f && p <= 1.0f, what << ": probability " << p << " outside [0, 1]");
    cuda::require_device_storage(in.dtype, what);
    if (p == 0.0f) {  // identity
      copy(out.data, in.data, in.bytes());
      return;
    }
    cuda::dropout(stream_, p, km::dropout_key(seed, step), layer, sample_ids, in, out);
  }

  int device_;
  int compute_major_ = 0;
  cuda::AttentionKernel attention_kernel_ = cuda::AttentionKernel::reference;  // HPCTRAIN_CUDA_ATTENTION
  std::string name_;
  DeviceUuid uuid_{};
  cudaStream_t stream_ = nullptr;
  cudaEvent_t wait_event_ = nullptr;
  std::function<void()> monitor_;
  std::unique_ptr<cuda::CudaGemm> gemm_;
#if defined(HPCTRAIN_HAVE_CUDNN)
  std::unique_ptr<cuda::CudaConvolution> convolution_;  // cuDNN plans, made on first use of a shape
#endif
  std::unique_ptr<cuda::PinnedRing> ring_;      // small per-step host -> device copies
  std::unique_ptr<cuda::UploadQueue> uploads_;  // batches, on the copy stream
  std::unique_ptr<cuda::PhaseTimeline> timeline_;
  bool capturing_ = false;
  CaptureSlot capture_slot_ = CaptureSlot::step;
  cudaGraphExec_t graphs_[2] = {nullptr, nullptr};  // by CaptureSlot
  cuda::DeviceScratch bias_scratch_;                // (cols) the bias in the gemm output's dtype
  // Pre-activation buffers holding the aux a fused linear + activation forward wrote (by address), with its shape.
  struct FoldedAux {
    cuda::EpilogueChoice choice;
    std::int64_t rows = 0, cols = 0;
  };
  std::unordered_map<const void*, FoldedAux> folded_aux_;
  cuda::RowScratch rows_;                   // per-row loss results, reduction partials
  cuda::DeviceScratch statistics_scratch_;  // (chunks) partial sums + (chunks) flags
  cuda::SequenceScratch sequence_scratch_;  // attention backward's row sums, embedding sort
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
