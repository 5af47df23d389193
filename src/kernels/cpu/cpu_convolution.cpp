// Convolutions of the CPU backend.
//
// Which path a convolution takes:
// - f32 and bf16 storage: oneDNN 2.6 convolution primitives (the 2.x API: op descriptor, then primitive descriptor).
//   Weights stay PyTorch-shaped (out, in/groups, k...) in the model's buffers and activations in the geometry's layout.
//   Channels-last activations (what models on this backend use) are read and written in place: oneDNN's brgemm and
//   jit kernels take NHWC / NDHWC directly at their best speed. Channels-first activations have no fast kernel of
//   their own (on the plain layout oneDNN picks gemm-based kernels, 2-10x slower), so for them the primitives run on
//   the layouts oneDNN prefers (format `any`: channel-blocked) and the activations are reordered into shared scratch
//   on the way in and out of every call. Weights are reordered into oneDNN's blocked layout per call in both cases
//   (they change every step; they are small next to the activations). (Timing variants per shape and keeping the
//   faster was tried: it made the kernel choice, and so the last bits of the results, depend on the machine's load,
//   which breaks bitwise-exact resume.) oneDNN accumulates in fp32. Weight and bias gradients are fp32 whatever the
//   input dtype.
// - f16 storage, and bf16 where oneDNN has no bf16 kernel (CPUs before AVX-512, see onednn_runs_bf16): inputs widened
//   to fp32 scratch, the f32 primitive, the result rounded once into the 16-bit output.
// - f64 storage: the loops below, in double, on channels-first rows (channels-last ones are transposed around them).
//   They are the reference: gradient checks run through them, and the tests compare the oneDNN paths with them.
// Gradient accumulation (accumulate = true) writes oneDNN's weight gradient into fp32 scratch and adds it.
#include "cpu_convolution.hpp"

#include <algorithm>
#include <array>
#include <deque>
#include <dnnl.hpp>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cpu_common.hpp"
#include "cpu_spatial.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {
namespace {

// ---------------------------------------------------------------------------------------------------------------------
// Reference loops (any dtype; used for f64)
// ---------------------------------------------------------------------------------------------------------------------

// What every loop needs: the geometry as 3-D, elements per channel in and out and per kernel, channels per group.
struct LoopSizes {
  Box box;
  std::int64_t in_size, out_size, kernel_size, group_in, group_out;
};

LoopSizes loop_sizes(const SpatialGeometry& g) {
  return {box_of(g),       g.input_size(),           g.output_size(),
          g.kernel_size(), g.in_channels / g.groups, g.out_channels / g.groups};
}

template <class T, class B>
void forward_loops(const SpatialGeometry& g, std::int64_t rows, const T* x, const T* w, const B* bias, T* y) {
  using C = compute_t<T>;
  const auto [b, in_size, out_size, kernel_size, group_in, group_out] = loop_sizes(g);
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t oc = 0; oc < g.out_channels; ++oc) {
      const std::int64_t first_in = oc / group_out * group_in;
      T* out = y + (n * g.out_channels + oc) * out_size;
      for_each_output(b, [&](std::int64_t o, std::int64_t od, std::int64_t oh, std::int64_t ow) {
        C sum = bias != nullptr ? static_cast<C>(bias[oc]) : C(0);
        for (std::int64_t local = 0; local < group_in; ++local) {
          const T* in = x + (n * g.in_channels + first_in + local) * in_size;
          const T* weights = w + (oc * group_in + local) * kernel_size;
          for_each_tap(b, od, oh, ow, [&](std::int64_t i, std::int64_t k) { sum += load(in[i]) * load(weights[k]); });
        }
        out[o] = store_from_double<T>(static_cast<double>(sum));
      });
    }
}

template <class T>
void backward_data_loops(const SpatialGeometry& g, std::int64_t rows, const T* dy, const T* w, T* dx) {
  using C = compute_t<T>;
  const auto [b, in_size, out_size, kernel_size, group_in, group_out] = loop_sizes(g);
  // Scatter form: each thread owns one (sample, group) block of dx, so no two threads write the same element.
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t group = 0; group < g.groups; ++group) {
      std::vector<C> sums(static_cast<std::size_t>(group_in * in_size), C(0));
      for (std::int64_t local_out = 0; local_out < group_out; ++local_out) {
        const std::int64_t oc = group * group_out + local_out;
        const T* gradient = dy + (n * g.out_channels + oc) * out_size;
        for_each_output(b, [&](std::int64_t o, std::int64_t od, std::int64_t oh, std::int64_t ow) {
          const C upstream = load(gradient[o]);
          for (std::int64_t local = 0; local < group_in; ++local) {
            const T* weights = w + (oc * group_in + local) * kernel_size;
            C* target = sums.data() + local * in_size;
            for_each_tap(b, od, oh, ow,
                         [&](std::int64_t i, std::int64_t k) { target[i] += upstream * load(weights[k]); });
          }
        });
      }
      T* out = dx + (n * g.in_channels + group * group_in) * in_size;
      for (std::int64_t i = 0; i < group_in * in_size; ++i)
        out[i] = store_from_double<T>(static_cast<double>(sums[static_cast<std::size_t>(i)]));
    }
}

template <class T, class M>
void backward_weights_loops(const SpatialGeometry& g, std::int64_t rows, const T* x, const T* dy, M* dw, M* dbias,
                            bool accumulate) {
  using C = compute_t<T>;
  const auto [b, in_size, out_size, kernel_size, group_in, group_out] = loop_sizes(g);
#pragma omp parallel for schedule(static)
  for (std::int64_t oc = 0; oc < g.out_channels; ++oc) {
    const std::int64_t first_in = oc / group_out * group_in;
    std::vector<C> sums(static_cast<std::size_t>(group_in * kernel_size), C(0));
    C bias_sum = 0;
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* gradient = dy + (n * g.out_channels + oc) * out_size;
      for_each_output(b, [&](std::int64_t o, std::int64_t od, std::int64_t oh, std::int64_t ow) {
        const C upstream = load(gradient[o]);
        bias_sum += upstream;
        for (std::int64_t local = 0; local < group_in; ++local) {
          const T* in = x + (n * g.in_channels + first_in + local) * in_size;
          C* target = sums.data() + local * kernel_size;
          for_each_tap(b, od, oh, ow, [&](std::int64_t i, std::int64_t k) { target[k] += upstream * load(in[i]); });
        }
      });
    }
    M* out = dw + oc * group_in * kernel_size;
    for (std::int64_t i = 0; i < group_in * kernel_size; ++i)
      out[i] = static_cast<M>(sums[static_cast<std::size_t>(i)]) + (accumulate ? out[i] : M(0));
    if (dbias != nullptr) dbias[oc] = static_cast<M>(bias_sum) + (accumulate ? dbias[oc] : M(0));
  }
}

// The loops work on channels-first rows: channels-last operands are transposed into copies around them (the reference
// path, so the copies cost nothing that matters).
class ChannelsFirstOperands {
 public:
  explicit ChannelsFirstOperands(SpatialLayout layout) : transpose_(layout == SpatialLayout::channels_last) {}
  ChannelsFirstOperands(const ChannelsFirstOperands&) = delete;
  ChannelsFirstOperands& operator=(const ChannelsFirstOperands&) = delete;
  ~ChannelsFirstOperands() = default;

  const double* read(const TensorView& operand, std::int64_t channels) {
    if (!transpose_) return operand.as<double>();
    std::vector<double>& copy = copies_.emplace_back(static_cast<std::size_t>(operand.size()));
    convert_layout(channels, SpatialLayout::channels_last, operand,
                   {copy.data(), DType::f64, operand.rows, operand.cols});
    return copy.data();
  }
  // The loops write the returned buffer; finish() moves it into `operand`.
  double* write(const TensorView& operand, std::int64_t channels) {
    if (!transpose_) return operand.as<double>();
    std::vector<double>& copy = copies_.emplace_back(static_cast<std::size_t>(operand.size()));
    outputs_.push_back({operand, channels, copies_.size() - 1});
    return copy.data();
  }
  void finish() {
    for (const Output& output : outputs_) {
      std::vector<double>& copy = copies_[output.copy];
      convert_layout(output.channels, SpatialLayout::channels_first,
                     {copy.data(), DType::f64, output.operand.rows, output.operand.cols}, output.operand);
    }
  }

 private:
  struct Output {
    TensorView operand;
    std::int64_t channels;
    std::size_t copy;
  };
  bool transpose_;
  std::deque<std::vector<double>> copies_;  // a deque: growing it keeps the earlier copies where they are
  std::vector<Output> outputs_;
};

// ---------------------------------------------------------------------------------------------------------------------
// oneDNN primitives (f32, bf16)
// ---------------------------------------------------------------------------------------------------------------------

using DnnlType = dnnl::memory::data_type;
using Tag = dnnl::memory::format_tag;

enum class Pass : std::uint8_t { forward, backward_data, backward_weights };

// Everything that decides a primitive.
struct ConvolutionKey {
  SpatialGeometry geometry;
  std::int64_t rows = 0;
  DType input = DType::f32;  // activations and weights as oneDNN sees them (f32 or bf16)
  Pass pass = Pass::forward;
  bool bias = false;
  bool operator==(const ConvolutionKey&) const = default;
};

struct ConvolutionKeyHash {
  std::size_t operator()(const ConvolutionKey& key) const {
    std::size_t hash = 0;
    const auto mix = [&hash](std::int64_t value) { hash_combine(hash, static_cast<std::uint64_t>(value)); };
    spatial::hash_geometry(hash, key.geometry);
    mix(key.rows);
    mix(static_cast<std::int64_t>(key.input) | static_cast<std::int64_t>(key.pass) << 4 |
        static_cast<std::int64_t>(key.bias) << 8);
    return hash;
  }
};

// One argument of a convolution: the caller's buffer in the plain layout, and, when oneDNN's fastest kernel wants
// another layout (channel-blocked, e.g. nChw16c), that layout in shared scratch with the reorder between the two.
struct Operand {
  dnnl::memory user;      // plain NCHW / NCDHW / PyTorch weight layout; handle set per call
  dnnl::memory internal;  // oneDNN's layout; empty when it is the plain one
  dnnl::primitive reorder;
  std::array<dnnl_exec_arg_t, 2> reorder_arguments{};
  bool output = false;
  std::size_t internal_bytes = 0;
};

// A created primitive and memory objects without buffers of their own: every call points them at the caller's
// buffers (and the shared scratch), so a call creates no oneDNN object.
struct Convolution {
  dnnl::primitive primitive;
  std::vector<Operand> operands;  // in the order of execute()'s pointers
  dnnl::memory scratchpad;
  std::array<dnnl_exec_arg_t, 6> arguments{};
  int argument_count = 0;
  std::size_t scratchpad_bytes = 0;
};

DnnlType dnnl_type(DType type) { return type == DType::bf16 ? DnnlType::bf16 : DnnlType::f32; }

dnnl::memory::dims extents(const std::array<std::int64_t, 3>& values, int dimensions, std::int64_t minus = 0) {
  dnnl::memory::dims dims;
  for (int axis = 0; axis < dimensions; ++axis) dims.push_back(values[static_cast<std::size_t>(axis)] - minus);
  return dims;
}

dnnl::memory::desc activation_descriptor(std::int64_t rows, std::int64_t channels,
                                         const std::array<std::int64_t, 3>& spatial, int dimensions, DnnlType type,
                                         SpatialLayout layout) {
  dnnl::memory::dims dims{rows, channels};
  for (auto extent : extents(spatial, dimensions)) dims.push_back(extent);
  if (layout == SpatialLayout::channels_last) return {dims, type, dimensions == 2 ? Tag::nhwc : Tag::ndhwc};
  return {dims, type, dimensions == 2 ? Tag::nchw : Tag::ncdhw};
}

// PyTorch's (out, in/groups, k...) weight, seen as (groups, out/groups, in/groups, k...) when grouped.
dnnl::memory::desc weight_descriptor(const SpatialGeometry& g, DnnlType type) {
  dnnl::memory::dims dims;
  if (g.groups > 1) dims.push_back(g.groups);
  dims.push_back(g.out_channels / g.groups);
  dims.push_back(g.in_channels / g.groups);
  for (auto extent : extents(g.kernel, g.dimensions)) dims.push_back(extent);
  const Tag tag =
      g.groups > 1 ? (g.dimensions == 2 ? Tag::goihw : Tag::goidhw) : (g.dimensions == 2 ? Tag::oihw : Tag::oidhw);
  return {dims, type, tag};
}

// 16-bit storage oneDNN does not run natively here: fp16 always, bf16 before AVX-512 (see onednn_runs_bf16).
bool widens(DType type) { return type == DType::f16 || (type == DType::bf16 && !onednn_runs_bf16()); }

void add_into(const float* source, float* destination, std::int64_t count) {
#pragma omp parallel for schedule(static) if (count > 32768)
  for (std::int64_t i = 0; i < count; ++i) destination[i] += source[i];
}

}  // namespace

struct CpuConvolution::Impl {
  ConvolutionLayouts layouts = ConvolutionLayouts::preferred;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<ConvolutionKey, Convolution, ConvolutionKeyHash> primitives;
  ScratchBuffer widened_source, widened_other;  // f16 inputs as fp32
  ScratchBuffer float_result;                   // fp32 result before rounding into f16, or before accumulating
  ScratchBuffer float_bias;                     // fp32 bias gradient before accumulating
  ScratchBuffer scratchpad;                     // oneDNN's own scratch (user-managed)
  std::array<ScratchBuffer, 4> internal;        // operand i in oneDNN's layout (one buffer per operand position)
  std::mutex mutex;

  // Adds an operand: the primitive reads or writes `chosen`; the caller's buffer has the plain layout `user`.
  void add_operand(Convolution& created, int argument, const dnnl::memory::desc& user, const dnnl::memory::desc& chosen,
                   bool output);

  Convolution& convolution(const ConvolutionKey& key);
  Convolution create(const ConvolutionKey& key, bool preferred_layouts);
  void run(Convolution& entry, std::initializer_list<const void*> pointers);
  // Pointers in the argument order of the pass: forward (src, weights, [bias], dst); backward_data (diff_dst,
  // weights, diff_src); backward_weights (src, diff_dst, diff_weights, [diff_bias]).
  void execute(const ConvolutionKey& key, std::initializer_list<const void*> pointers);
  // Forward (a = x, b = weights, out = y) or backward data (a = dy, b = weights, out = dx), f16 through fp32.
  void execute_product(ConvolutionKey key, const TensorView& a, const TensorView& b, const void* bias,
                       const TensorView& out);
};

void CpuConvolution::Impl::add_operand(Convolution& created, int argument, const dnnl::memory::desc& user,
                                       const dnnl::memory::desc& chosen, bool output) {
  Operand operand;
  operand.output = output;
  operand.user = dnnl::memory(user, engine, DNNL_MEMORY_NONE);
  dnnl::memory* seen_by_primitive = &operand.user;
  if (chosen != user) {
    operand.internal = dnnl::memory(chosen, engine, DNNL_MEMORY_NONE);
    operand.internal_bytes = chosen.get_size();
    operand.reorder =
        output ? dnnl::reorder(operand.internal, operand.user) : dnnl::reorder(operand.user, operand.internal);
    const dnnl::memory& from = output ? operand.internal : operand.user;
    const dnnl::memory& to = output ? operand.user : operand.internal;
    operand.reorder_arguments = {dnnl_exec_arg_t{DNNL_ARG_FROM, from.get()}, dnnl_exec_arg_t{DNNL_ARG_TO, to.get()}};
    seen_by_primitive = &operand.internal;
  }
  created.arguments[static_cast<std::size_t>(created.argument_count++)] = {argument, seen_by_primitive->get()};
  created.operands.push_back(std::move(operand));
}

Convolution& CpuConvolution::Impl::convolution(const ConvolutionKey& key) {
  const auto found = primitives.find(key);
  if (found != primitives.end()) return found->second;
  return primitives.emplace(key, create(key, layouts == ConvolutionLayouts::preferred)).first->second;
}

Convolution CpuConvolution::Impl::create(const ConvolutionKey& key, bool preferred_layouts) {
  const SpatialGeometry& g = key.geometry;
  try {
    const DnnlType type = dnnl_type(key.input);
    const auto source = activation_descriptor(key.rows, g.in_channels, g.input, g.dimensions, type, g.layout);
    const auto destination = activation_descriptor(key.rows, g.out_channels, g.output, g.dimensions, type, g.layout);
    const auto weights = weight_descriptor(g, type);
    const auto weights_f32 = weight_descriptor(g, DnnlType::f32);
    const dnnl::memory::desc bias({g.out_channels}, DnnlType::f32, Tag::x);
    const auto strides = extents(g.stride, g.dimensions);
    const auto dilations = extents(g.dilation, g.dimensions, 1);  // oneDNN counts the gaps: 0 = dense
    const auto padding = extents(g.padding, g.dimensions);
    dnnl::primitive_attr attributes;
    attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const auto algorithm = dnnl::algorithm::convolution_direct;

    // Layouts left to oneDNN (format `any`): it picks its fastest kernel's layout (channel-blocked on AVX-512), and
    // the operands whose layout differs from the caller's are reordered on the way in and out. Channels-last
    // activations are kept as they are (the kernels read them directly); weights are always left to oneDNN.
    const auto any_weights = [preferred_layouts](const dnnl::memory::desc& plain) {
      return preferred_layouts ? dnnl::memory::desc(plain.dims(), plain.data_type(), Tag::any) : plain;
    };
    const auto any = [&](const dnnl::memory::desc& plain) {
      return g.layout == SpatialLayout::channels_last ? plain : any_weights(plain);
    };
    const dnnl::convolution_forward::desc forward_op =
        key.bias && key.pass == Pass::forward
            ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algorithm, any(source),
                                              any_weights(weights), bias, any(destination), strides, dilations, padding,
                                              padding)
            : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algorithm, any(source),
                                              any_weights(weights), any(destination), strides, dilations, padding,
                                              padding);
    const dnnl::convolution_forward::primitive_desc forward(forward_op, attributes, engine);

    Convolution created;
    dnnl::memory::desc scratchpad_desc;
    switch (key.pass) {
      case Pass::forward:
        created.primitive = dnnl::convolution_forward(forward);
        add_operand(created, DNNL_ARG_SRC, source, forward.src_desc(), false);
        add_operand(created, DNNL_ARG_WEIGHTS, weights, forward.weights_desc(), false);
        if (key.bias) add_operand(created, DNNL_ARG_BIAS, bias, bias, false);
        add_operand(created, DNNL_ARG_DST, destination, forward.dst_desc(), true);
        scratchpad_desc = forward.scratchpad_desc();
        break;
      case Pass::backward_data: {
        const dnnl::convolution_backward_data::desc op(algorithm, any(source), any_weights(weights), any(destination),
                                                       strides, dilations, padding, padding);
        const dnnl::convolution_backward_data::primitive_desc descriptor(op, attributes, engine, forward);
        created.primitive = dnnl::convolution_backward_data(descriptor);
        add_operand(created, DNNL_ARG_DIFF_DST, destination, descriptor.diff_dst_desc(), false);
        add_operand(created, DNNL_ARG_WEIGHTS, weights, descriptor.weights_desc(), false);
        add_operand(created, DNNL_ARG_DIFF_SRC, source, descriptor.diff_src_desc(), true);
        scratchpad_desc = descriptor.scratchpad_desc();
        break;
      }
      case Pass::backward_weights: {
        const auto op =
            key.bias ? dnnl::convolution_backward_weights::desc(algorithm, any(source), any_weights(weights_f32), bias,
                                                                any(destination), strides, dilations, padding, padding)
                     : dnnl::convolution_backward_weights::desc(algorithm, any(source), any_weights(weights_f32),
                                                                any(destination), strides, dilations, padding, padding);
        const dnnl::convolution_backward_weights::primitive_desc descriptor(op, attributes, engine, forward);
        created.primitive = dnnl::convolution_backward_weights(descriptor);
        add_operand(created, DNNL_ARG_SRC, source, descriptor.src_desc(), false);
        add_operand(created, DNNL_ARG_DIFF_DST, destination, descriptor.diff_dst_desc(), false);
        add_operand(created, DNNL_ARG_DIFF_WEIGHTS, weights_f32, descriptor.diff_weights_desc(), true);
        if (key.bias) add_operand(created, DNNL_ARG_DIFF_BIAS, bias, descriptor.diff_bias_desc(), true);
        scratchpad_desc = descriptor.scratchpad_desc();
        break;
      }
    }
    created.scratchpad_bytes = scratchpad_desc.get_size();
    if (created.scratchpad_bytes > 0) {
      created.scratchpad = dnnl::memory(scratchpad_desc, engine, DNNL_MEMORY_NONE);
      created.arguments[static_cast<std::size_t>(created.argument_count++)] = {DNNL_ARG_SCRATCHPAD,
                                                                               created.scratchpad.get()};
    }
    return created;
  } catch (const dnnl::error& error) {
    std::ostringstream detail;
    detail << error.what() << " (status " << static_cast<int>(error.status) << ") for a " << g.dimensions
           << "-D convolution of " << key.rows << " samples, " << g.in_channels << " -> " << g.out_channels
           << " channels, " << g.groups << " groups, " << dtype_name(key.input);
    throw LibraryError("oneDNN", "convolution primitive creation", detail.str(), __FILE__, __LINE__);
  }
}

void CpuConvolution::Impl::execute(const ConvolutionKey& key, std::initializer_list<const void*> pointers) {
  run(convolution(key), pointers);
}

void CpuConvolution::Impl::execute_product(ConvolutionKey key, const TensorView& a, const TensorView& b,
                                           const void* bias, const TensorView& out) {
  const void* a_data = a.data;
  const void* b_data = b.data;
  void* out_data = out.data;
  float* result = nullptr;
  if (widens(a.dtype)) {  // widened to fp32, the f32 primitive, rounded once into the output
    key.input = DType::f32;
    float* wide_a = widened_source.reserve_elements<float>(static_cast<std::size_t>(a.size()));
    float* wide_b = widened_other.reserve_elements<float>(static_cast<std::size_t>(b.size()));
    widen_16bit_to_float(a.data, a.dtype == DType::bf16, wide_a, a.size());
    widen_16bit_to_float(b.data, b.dtype == DType::bf16, wide_b, b.size());
    a_data = wide_a;
    b_data = wide_b;
    out_data = result = float_result.reserve_elements<float>(static_cast<std::size_t>(out.size()));
  }
  if (bias != nullptr)
    execute(key, {a_data, b_data, bias, out_data});
  else
    execute(key, {a_data, b_data, out_data});
  if (result != nullptr) {
    if (out.dtype == DType::bf16)
      narrow_from_float(result, out.as<bf16>(), out.size());
    else
      narrow_from_float(result, out.as<fp16>(), out.size());
  }
}

void CpuConvolution::Impl::run(Convolution& entry, std::initializer_list<const void*> pointers) {
  HPCTRAIN_ASSERT(pointers.size() == entry.operands.size(),
                  "convolution: " << pointers.size() << " buffers for " << entry.operands.size() << " operands");
  const auto check = [](dnnl_status_t status, const char* what) {
    if (status != dnnl_success)
      throw LibraryError("oneDNN", what, "status " + std::to_string(static_cast<int>(status)), __FILE__, __LINE__);
  };
  const auto run_reorder = [&](Operand& operand) {
    check(dnnl_primitive_execute(operand.reorder.get(), stream.get(), 2, operand.reorder_arguments.data()),
          "dnnl_primitive_execute(reorder)");
  };
  std::size_t index = 0;
  for (const void* pointer : pointers) {
    Operand& operand = entry.operands[index];
    // oneDNN takes non-const handles but only reads the inputs.
    operand.user.set_data_handle(const_cast<void*>(pointer));
    if (operand.internal_bytes > 0) {
      operand.internal.set_data_handle(internal[index].reserve(operand.internal_bytes));
      if (!operand.output) run_reorder(operand);
    }
    ++index;
  }
  if (entry.scratchpad_bytes > 0) entry.scratchpad.set_data_handle(scratchpad.reserve(entry.scratchpad_bytes));
  check(dnnl_primitive_execute(entry.primitive.get(), stream.get(), entry.argument_count, entry.arguments.data()),
        "dnnl_primitive_execute(convolution)");
  for (Operand& operand : entry.operands)
    if (operand.output && operand.internal_bytes > 0) run_reorder(operand);
  check(dnnl_stream_wait(stream.get()), "dnnl_stream_wait");
}

CpuConvolution::CpuConvolution(ConvolutionLayouts layouts) : impl_(std::make_unique<Impl>()) {
  impl_->layouts = layouts;
}
CpuConvolution::~CpuConvolution() = default;

std::size_t CpuConvolution::cached_primitives() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->primitives.size();
}

void CpuConvolution::forward(const SpatialGeometry& g, const TensorView& x, const TensorView& weight, const void* bias,
                             const TensorView& y) {
  spatial::check_convolution(g, x, y, weight, "convolution_forward");
  HPCTRAIN_ASSERT(weight.dtype == x.dtype, "convolution_forward: weights of another dtype");
  if (x.rows == 0) return;
  if (x.dtype == DType::f64) {
    ChannelsFirstOperands operands(g.layout);
    const double* input = operands.read(x, g.in_channels);
    forward_loops(g, x.rows, input, weight.as<double>(), static_cast<const double*>(bias),
                  operands.write(y, g.out_channels));
    operands.finish();
    return;
  }
  const std::lock_guard lock(impl_->mutex);
  impl_->execute_product({g, x.rows, x.dtype, Pass::forward, bias != nullptr}, x, weight, bias, y);
}

void CpuConvolution::backward_data(const SpatialGeometry& g, const TensorView& dy, const TensorView& weight,
                                   const TensorView& dx) {
  spatial::check_convolution(g, dx, dy, weight, "convolution_backward_data");
  HPCTRAIN_ASSERT(weight.dtype == dy.dtype, "convolution_backward_data: weights of another dtype");
  if (dy.rows == 0) return;
  if (dy.dtype == DType::f64) {
    ChannelsFirstOperands operands(g.layout);
    const double* gradient = operands.read(dy, g.out_channels);
    backward_data_loops(g, dy.rows, gradient, weight.as<double>(), operands.write(dx, g.in_channels));
    operands.finish();
    return;
  }
  const std::lock_guard lock(impl_->mutex);
  impl_->execute_product({g, dy.rows, dy.dtype, Pass::backward_data, false}, dy, weight, nullptr, dx);
}

void CpuConvolution::backward_weights(const SpatialGeometry& g, const TensorView& x, const TensorView& dy,
                                      const TensorView& dweight, void* dbias, bool accumulate) {
  spatial::check_convolution(g, x, dy, dweight, "convolution_backward_weights");
  if (x.dtype == DType::f64) {
    ChannelsFirstOperands operands(g.layout);
    const double* input = operands.read(x, g.in_channels);
    const double* gradient = operands.read(dy, g.out_channels);
    backward_weights_loops(g, x.rows, input, gradient, dweight.as<double>(), static_cast<double*>(dbias), accumulate);
    return;
  }
  HPCTRAIN_ASSERT(dweight.dtype == DType::f32, "convolution_backward_weights: gradients are f32");
  if (x.rows == 0) {
    if (!accumulate) {
      std::fill_n(dweight.as<float>(), dweight.size(), 0.0f);
      if (dbias != nullptr) std::fill_n(static_cast<float*>(dbias), g.out_channels, 0.0f);
    }
    return;
  }
  const std::lock_guard lock(impl_->mutex);
  ConvolutionKey key{g, x.rows, x.dtype, Pass::backward_weights, dbias != nullptr};
  const void* source = x.data;
  const void* gradient = dy.data;
  if (widens(x.dtype)) {
    key.input = DType::f32;
    float* wide_x = impl_->widened_source.reserve_elements<float>(static_cast<std::size_t>(x.size()));
    float* wide_dy = impl_->widened_other.reserve_elements<float>(static_cast<std::size_t>(dy.size()));
    widen_16bit_to_float(x.data, x.dtype == DType::bf16, wide_x, x.size());
    widen_16bit_to_float(dy.data, dy.dtype == DType::bf16, wide_dy, dy.size());
    source = wide_x;
    gradient = wide_dy;
  }
  float* weights_out = dweight.as<float>();
  auto* bias_out = static_cast<float*>(dbias);
  if (accumulate) {
    weights_out = impl_->float_result.reserve_elements<float>(static_cast<std::size_t>(dweight.size()));
    if (dbias != nullptr)
      bias_out = impl_->float_bias.reserve_elements<float>(static_cast<std::size_t>(g.out_channels));
  }
  if (key.bias)
    impl_->execute(key, {source, gradient, weights_out, bias_out});
  else
    impl_->execute(key, {source, gradient, weights_out});
  if (accumulate) {
    add_into(weights_out, dweight.as<float>(), dweight.size());
    if (dbias != nullptr) add_into(bias_out, static_cast<float*>(dbias), g.out_channels);
  }
}

}  // namespace hpctrain::cpu
