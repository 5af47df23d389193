// Matrix products of the CPU backend through oneDNN 2.6 matmul primitives (the 2.x API: op descriptor, then primitive
// descriptor).
//
// Which path a product takes:
// - f32 x f32 -> f32 and bf16 x bf16 -> f32 or bf16: one oneDNN primitive writes c directly (bias and accumulation
//   included: bias as the primitive's bias, accumulation as a sum post-op, a residual addend as a binary add
//   post-op, applied after the bias in fp32). bf16 runs oneDNN's AVX512-BF16/AMX kernels.
// - f16 inputs, and bf16 inputs on CPUs where oneDNN 2.6 has no bf16 kernel (before AVX-512): widened to fp32
//   scratch first (exact), then the f32 path; the result is rounded once into c.
// - any other output dtype: the primitive writes fp32 scratch, and one pass converts it into c (adding c's old value
//   when accumulating), so rounding happens once, after the accumulation.
// - f64: plain loops in double; only finite-difference gradient checks use it, on small matrices.
// Transposes are strides in the memory descriptors, never copies (but see the row-major copy of a transposed first
// operand, and the staging of the second operand for oneDNN's AVX2 sgemm, in CpuGemm::run).
#include "cpu_gemm.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <dnnl.hpp>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "cpu_common.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {
namespace {

using DnnlType = dnnl::memory::data_type;

DnnlType dnnl_type(DType type) {
  switch (type) {
    case DType::f32:
      return DnnlType::f32;
    case DType::bf16:
      return DnnlType::bf16;
    case DType::f16:
      return DnnlType::f16;
    case DType::f64:
      break;
  }
  HPCTRAIN_ASSERT(false, "oneDNN matmul has no " << dtype_name(type) << " path");
}

// Everything that decides a primitive: shapes, transposes, the dtypes oneDNN sees, bias, sum post-op.
struct MatmulKey {
  std::int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  DType input = DType::f32, output = DType::f32;
  bool bias = false, accumulate = false, addend = false;
  bool operator==(const MatmulKey&) const = default;
};

struct MatmulKeyHash {
  std::size_t operator()(const MatmulKey& key) const {
    std::size_t hash = 0;
    const auto mix = [&hash](std::uint64_t value) { hash_combine(hash, value); };
    mix(static_cast<std::uint64_t>(key.m));
    mix(static_cast<std::uint64_t>(key.n));
    mix(static_cast<std::uint64_t>(key.k));
    mix((key.transpose_a ? 1u : 0u) | (key.transpose_b ? 2u : 0u) | (key.bias ? 4u : 0u) | (key.accumulate ? 8u : 0u) |
        (key.addend ? 16u : 0u) | (static_cast<unsigned>(key.input) << 8) | (static_cast<unsigned>(key.output) << 12));
    return hash;
  }
};

// A created primitive with its memory objects. The memory objects have no buffer of their own; every call points them
// at the caller's buffers, so a call creates no oneDNN object.
struct Matmul {
  dnnl::matmul primitive;
  dnnl::memory source, weights, bias, destination, addend, scratchpad;
  std::size_t scratchpad_bytes = 0;
  std::array<dnnl_exec_arg_t, 6> arguments{};
  int argument_count = 0;
};

// Logical (rows, cols) matrix stored row-major, or stored transposed as (cols, rows): the transpose is in the strides.
dnnl::memory::desc matrix_descriptor(std::int64_t rows, std::int64_t cols, bool stored_transposed, DnnlType type) {
  const dnnl::memory::dims strides = stored_transposed ? dnnl::memory::dims{1, rows} : dnnl::memory::dims{cols, 1};
  return dnnl::memory::desc({rows, cols}, type, strides);
}

// c = converted(result [+ addend]) [+ c]: the last step of the paths whose output dtype oneDNN does not write.
template <class T>
void store_result(const float* result, T* c, const T* addend, std::int64_t count, bool accumulate) {
#pragma omp parallel for schedule(static) if (count > 32768)
  for (std::int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<T, double>) {
      c[i] = static_cast<double>(result[i]) + (accumulate ? c[i] : 0.0) + (addend != nullptr ? addend[i] : 0.0);
    } else {
      c[i] = store<T>(result[i] + (accumulate ? load(c[i]) : 0.0f) + (addend != nullptr ? load(addend[i]) : 0.0f));
    }
  }
}

// Reference-style loops for f64 inputs (gradient checks). Sums in double; c of any dtype.
template <class TC>
void gemm_double(const double* a, bool transpose_a, const double* b, bool transpose_b, TC* c, const double* bias,
                 bool accumulate, const TC* addend, std::int64_t m, std::int64_t n, std::int64_t k) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = bias != nullptr ? bias[j] : 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double a_ip = transpose_a ? a[p * m + i] : a[i * k + p];  // a: (m, k) or stored (k, m)
        const double b_pj = transpose_b ? b[j * k + p] : b[p * n + j];  // b: (k, n) or stored (n, k)
        sum += a_ip * b_pj;
      }
      if (accumulate) sum += static_cast<double>(load(c[i * n + j]));
      if (addend != nullptr) sum += static_cast<double>(load(addend[i * n + j]));
      c[i * n + j] = store_from_double<TC>(sum);
    }
  }
}

// out (cols, rows) = in (rows, cols) transposed, bit for bit, in tiles (both sides stay in cache lines).
template <class Bits>
void transpose_copy(const Bits* in, Bits* out, std::int64_t rows, std::int64_t cols) {
  constexpr std::int64_t tile = 32;
  const std::int64_t row_tiles = (rows + tile - 1) / tile, col_tiles = (cols + tile - 1) / tile;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t row_tile = 0; row_tile < row_tiles; ++row_tile)
    for (std::int64_t col_tile = 0; col_tile < col_tiles; ++col_tile) {
      const std::int64_t row_end = std::min(rows, (row_tile + 1) * tile);
      const std::int64_t col_end = std::min(cols, (col_tile + 1) * tile);
      for (std::int64_t col = col_tile * tile; col < col_end; ++col)
        for (std::int64_t row = row_tile * tile; row < row_end; ++row) out[col * rows + row] = in[row * cols + col];
    }
}

// k == 0: the product is empty, c = bias [+ c]. oneDNN is not asked about zero-sized reductions.
template <class TC, class TB>
void bias_only(TC* c, const TB* bias, bool accumulate, const TC* addend, std::int64_t m, std::int64_t n) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double value = bias != nullptr ? static_cast<double>(bias[j]) : 0.0;
      if (accumulate) value += static_cast<double>(load(c[i * n + j]));
      if (addend != nullptr) value += static_cast<double>(load(addend[i * n + j]));
      c[i * n + j] = store_from_double<TC>(value);
    }
}

}  // namespace

bool onednn_runs_bf16() {
  static const bool runs = [] {
    if (const char* setting = std::getenv("HPCTRAIN_ONEDNN_BF16"); setting != nullptr && std::string(setting) == "0")
      return false;
    try {  // the smallest bf16 product: creation fails where the CPU has no bf16 kernel
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const auto desc = matrix_descriptor(2, 2, false, DnnlType::bf16);
      const dnnl::matmul::primitive_desc probe(dnnl::matmul::desc(desc, desc, desc), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return runs;
}

// oneDNN 2.6 runs fp32 products through its AVX2 sgemm on CPUs without AVX-512. There a product whose second operand
// is not transposed (b (k, n) row-major: the backward-data product dy x W, the weight gradient's x) runs up to 1.7x
// slower when b starts on a 32-byte boundary than at any other offset (the MLP's 256x2048x2048 backward-data product:
// 30-32 ms against 15-19 ms, ONEDNN_VERBOSE, AMD EPYC with AVX2; the same bits either way). hpctrain's buffers are
// 64-byte aligned, so there such operands are staged this many bytes past a boundary.
constexpr std::size_t avx2_sgemm_b_offset = 16;

bool onednn_runs_avx2_sgemm() {
#if defined(__x86_64__)
  static const bool avx2 = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return (isa & avx512) != avx512;  // the ISA values are nested bit masks
  }();
  return avx2;
#else
  return false;
#endif
}

// A buffer of `elements` floats that starts avx2_sgemm_b_offset bytes past a 64-byte boundary.
float* offset_floats(ScratchBuffer& buffer, std::size_t elements) {
  return reinterpret_cast<float*>(static_cast<char*>(buffer.reserve(elements * sizeof(float) + avx2_sgemm_b_offset)) +
                                  avx2_sgemm_b_offset);
}

struct CpuGemm::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<MatmulKey, Matmul, MatmulKeyHash> primitives;
  ScratchBuffer widened_a, widened_b;  // 16-bit inputs as fp32: (m, k), (k, n) in their stored layout
  ScratchBuffer float_result;          // (m, n) fp32 result for output dtypes oneDNN does not write
  ScratchBuffer transposed_a;          // op(a) = a^T copied row-major (m, k): see CpuGemm::run
  ScratchBuffer staged_b;              // b off a 32-byte boundary for the AVX2 sgemm (avx2_sgemm_b_offset)
  ScratchBuffer scratchpad;            // oneDNN's own scratch (user-managed, so oneDNN allocates none per call)
  std::mutex mutex;                    // the cache and the scratch buffers are shared by all calls

  Matmul& matmul(const MatmulKey& key);
  void execute(const MatmulKey& key, const void* a, const void* b, const void* bias, void* c,
               const void* addend = nullptr);
};

Matmul& CpuGemm::Impl::matmul(const MatmulKey& key) {
  const auto found = primitives.find(key);
  if (found != primitives.end()) return found->second;
  try {
    const DnnlType input = dnnl_type(key.input);
    const auto source_desc = matrix_descriptor(key.m, key.k, key.transpose_a, input);
    const auto weights_desc = matrix_descriptor(key.k, key.n, key.transpose_b, input);
    const auto destination_desc = matrix_descriptor(key.m, key.n, false, dnnl_type(key.output));
    const auto bias_desc = matrix_descriptor(1, key.n, false, DnnlType::f32);
    const auto op = key.bias ? dnnl::matmul::desc(source_desc, weights_desc, bias_desc, destination_desc)
                             : dnnl::matmul::desc(source_desc, weights_desc, destination_desc);
    dnnl::primitive_attr attributes;
    attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.accumulate || key.addend) {
      dnnl::post_ops post_ops;
      if (key.accumulate) post_ops.append_sum(1.0f);
      if (key.addend) post_ops.append_binary(dnnl::algorithm::binary_add, destination_desc);
      attributes.set_post_ops(post_ops);
    }
    const dnnl::matmul::primitive_desc descriptor(op, attributes, engine);

    Matmul created;
    created.primitive = dnnl::matmul(descriptor);
    created.source = dnnl::memory(source_desc, engine, DNNL_MEMORY_NONE);
    created.weights = dnnl::memory(weights_desc, engine, DNNL_MEMORY_NONE);
    created.destination = dnnl::memory(destination_desc, engine, DNNL_MEMORY_NONE);
    created.arguments[0] = {DNNL_ARG_SRC, created.source.get()};
    created.arguments[1] = {DNNL_ARG_WEIGHTS, created.weights.get()};
    created.arguments[2] = {DNNL_ARG_DST, created.destination.get()};
    created.argument_count = 3;
    if (key.bias) {
      created.bias = dnnl::memory(bias_desc, engine, DNNL_MEMORY_NONE);
      created.arguments[created.argument_count++] = {DNNL_ARG_BIAS, created.bias.get()};
    }
    if (key.addend) {  // the first (only) post-op's second source
      created.addend = dnnl::memory(destination_desc, engine, DNNL_MEMORY_NONE);
      created.arguments[created.argument_count++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                                                     created.addend.get()};
    }
    const auto scratchpad_desc = descriptor.scratchpad_desc();
    created.scratchpad_bytes = scratchpad_desc.get_size();
    if (created.scratchpad_bytes > 0) {
      created.scratchpad = dnnl::memory(scratchpad_desc, engine, DNNL_MEMORY_NONE);
      created.arguments[created.argument_count++] = {DNNL_ARG_SCRATCHPAD, created.scratchpad.get()};
    }
    return primitives.emplace(key, std::move(created)).first->second;
  } catch (const dnnl::error& error) {
    std::ostringstream detail;
    detail << error.what() << " (status " << static_cast<int>(error.status) << ") for " << dtype_name(key.input) << " ("
           << key.m << "x" << key.k << (key.transpose_a ? ", transposed" : "") << ") x (" << key.k << "x" << key.n
           << (key.transpose_b ? ", transposed" : "") << ") -> " << dtype_name(key.output);
    throw LibraryError("oneDNN", "matmul primitive creation", detail.str(), __FILE__, __LINE__);
  }
}

void CpuGemm::Impl::execute(const MatmulKey& key, const void* a, const void* b, const void* bias, void* c,
                            const void* addend) {
  Matmul& entry = matmul(key);
  // oneDNN takes non-const handles but only reads sources, weights and bias.
  entry.source.set_data_handle(const_cast<void*>(a));
  entry.weights.set_data_handle(const_cast<void*>(b));
  entry.destination.set_data_handle(c);
  if (key.bias) entry.bias.set_data_handle(const_cast<void*>(bias));
  if (key.addend) entry.addend.set_data_handle(const_cast<void*>(addend));
  if (entry.scratchpad_bytes > 0) entry.scratchpad.set_data_handle(scratchpad.reserve(entry.scratchpad_bytes));
  // The C entry point with the stored argument array: the C++ execute() builds a std::vector of arguments every call.
  dnnl_status_t status =
      dnnl_primitive_execute(entry.primitive.get(), stream.get(), entry.argument_count, entry.arguments.data());
  if (status == dnnl_success) status = dnnl_stream_wait(stream.get());
  if (status != dnnl_success)
    throw LibraryError("oneDNN", "dnnl_primitive_execute(matmul)", "status " + std::to_string(static_cast<int>(status)),
                       __FILE__, __LINE__);
}

CpuGemm::CpuGemm() : impl_(std::make_unique<Impl>()) {}
CpuGemm::~CpuGemm() = default;

std::size_t CpuGemm::cached_primitives() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->primitives.size();
}

void CpuGemm::run(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
                  const void* bias, bool accumulate, const void* addend) {
  HPCTRAIN_ASSERT(!(accumulate && addend != nullptr), "gemm: an addend with accumulate");
  HPCTRAIN_ASSERT(addend == nullptr || addend != c.data, "gemm: the addend aliases c");
  HPCTRAIN_ASSERT(a.dtype == b.dtype,
                  "gemm inputs must share a dtype, got " << dtype_name(a.dtype) << " and " << dtype_name(b.dtype));
  const std::int64_t m = transpose_a ? a.cols : a.rows;
  const std::int64_t k = transpose_a ? a.rows : a.cols;
  const std::int64_t k_of_b = transpose_b ? b.cols : b.rows;
  const std::int64_t n = transpose_b ? b.rows : b.cols;
  HPCTRAIN_ASSERT(k == k_of_b && c.rows == m && c.cols == n, "gemm shapes: op(a) " << m << "x" << k << ", op(b) "
                                                                                   << k_of_b << "x" << n << ", c "
                                                                                   << c.rows << "x" << c.cols);
  if (m == 0 || n == 0) return;
  const std::lock_guard lock(impl_->mutex);

  if (a.dtype == DType::f64) {
    dispatch_dtype(c.dtype, [&]<class TC>() {
      gemm_double(static_cast<const double*>(a.data), transpose_a, static_cast<const double*>(b.data), transpose_b,
                  static_cast<TC*>(c.data), static_cast<const double*>(bias), accumulate,
                  static_cast<const TC*>(addend), m, n, k);
    });
    return;
  }
  if (k == 0) {
    dispatch_dtype(c.dtype, [&]<class TC>() {
      bias_only(static_cast<TC*>(c.data), static_cast<const float*>(bias), accumulate, static_cast<const TC*>(addend),
                m, n);
    });
    return;
  }

  // Inputs as oneDNN sees them: f32 as they are, bf16 too where oneDNN runs it, else widened to fp32.
  const void* a_data = a.data;
  const void* b_data = b.data;
  DType input = a.dtype;
  const bool stage_b = !transpose_b && onednn_runs_avx2_sgemm();
  if (a.dtype == DType::f16 || (a.dtype == DType::bf16 && !onednn_runs_bf16())) {
    float* wide_a = impl_->widened_a.reserve_elements<float>(static_cast<std::size_t>(a.size()));
    const auto b_elements = static_cast<std::size_t>(b.size());
    float* wide_b = stage_b ? offset_floats(impl_->widened_b, b_elements)  // staged as it is widened: no extra copy
                            : impl_->widened_b.reserve_elements<float>(b_elements);
    widen_16bit_to_float(a.data, a.dtype == DType::bf16, wide_a, a.size());
    widen_16bit_to_float(b.data, b.dtype == DType::bf16, wide_b, b.size());
    a_data = wide_a;
    b_data = wide_b;
    input = DType::f32;
  }

  // A first operand stored transposed (the weight gradients dW = dy^T x, whose reduction runs over the batch rows):
  // oneDNN 2.6's brgemm matmul runs such a source at about half the rate of a row-major one (ONEDNN_VERBOSE, GPT-2
  // 124M's products, fp32 and bf16; docs/performance.md), so it gets a row-major copy first when the copy is small
  // against the product (it reads and writes m x k values, the product does 2 m n k flops).
  if (transpose_a && n >= 64 && m * k >= 16384) {
    const std::size_t bytes = dtype_size(input);
    void* copy = impl_->transposed_a.reserve(static_cast<std::size_t>(m * k) * bytes);
    if (bytes == 4)
      transpose_copy(static_cast<const std::uint32_t*>(a_data), static_cast<std::uint32_t*>(copy), k, m);
    else
      transpose_copy(static_cast<const std::uint16_t*>(a_data), static_cast<std::uint16_t*>(copy), k, m);
    a_data = copy;
    transpose_a = false;
  }
  // fp32 b on the AVX2 sgemm's boundary: staged off it when the product is large against the copy (2 m n k flops
  // against k n values copied; the copy costs ~2% of the MLP's backward-data product and saves ~40% of it).
  if (stage_b && input == DType::f32 && reinterpret_cast<std::uintptr_t>(b_data) % 32 == 0 && m >= 32 &&
      k * n >= 65536) {
    float* staged = offset_floats(impl_->staged_b, static_cast<std::size_t>(b.size()));
    widen_to_float(static_cast<const float*>(b_data), staged, b.size());  // (a parallel copy for float)
    b_data = staged;
  }
  MatmulKey key{m, n, k, transpose_a, transpose_b, input, c.dtype, bias != nullptr, accumulate, addend != nullptr};
  const bool writes_c_directly = c.dtype == DType::f32 || (input == DType::bf16 && c.dtype == DType::bf16);
  if (writes_c_directly) {
    impl_->execute(key, a_data, b_data, bias, c.data, addend);
    return;
  }
  key.output = DType::f32;
  key.accumulate = false;  // added while converting, in fp32, before the single rounding (the addend too)
  key.addend = false;
  float* result = impl_->float_result.reserve_elements<float>(static_cast<std::size_t>(m * n));
  impl_->execute(key, a_data, b_data, bias, result);
  dispatch_dtype(c.dtype, [&]<class TC>() {
    store_result(result, static_cast<TC*>(c.data), static_cast<const TC*>(addend), m * n, accumulate);
  });
}

}  // namespace hpctrain::cpu
