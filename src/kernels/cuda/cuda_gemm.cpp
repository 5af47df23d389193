// cuBLASLt matrix products of the CUDA backend (see cuda_gemm.hpp for the layout trick and the cached plans).
#include "cuda_gemm.hpp"

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"

namespace hpctrain::cuda {
namespace {

// 32 MiB: what NVIDIA recommends for Hopper; allocated once.
constexpr std::size_t workspace_size = 32u << 20;

cudaDataType_t cuda_type(DType type) {
  switch (type) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::f64:
      break;
  }
  throw NotSupported("fp64 matrix products on the CUDA backend (fp64 is for CPU gradient checks)");
}

// Largest power of two (up to 256) dividing the address: cuBLASLt's default assumes 256-byte aligned operands, and our
// operands are views at arbitrary offsets into larger buffers.
std::uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

template <class T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value));
}
template <class T>
void set_preference(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                    const T& value) {
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value));
}

cublasLtEpilogue_t cublas_epilogue(CudaGemm::Epilogue epilogue) {
  using E = CudaGemm::Epilogue;
  switch (epilogue) {
    case E::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case E::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case E::bias_gradient:  // column sums of cuBLASLt's B (our a = dy) over k: one per row of our c
      return CUBLASLT_EPILOGUE_BGRADB;
    case E::relu:
      return CUBLASLT_EPILOGUE_RELU;
    case E::relu_bias:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case E::relu_aux:
      return CUBLASLT_EPILOGUE_RELU_AUX;
    case E::relu_aux_bias:
      return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case E::gelu_aux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case E::gelu_aux_bias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case E::drelu:
      return CUBLASLT_EPILOGUE_DRELU;
    case E::dgelu:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  throw std::logic_error("unknown cuBLASLt epilogue");
}

}  // namespace

// Descriptors of one product and the algorithm chosen for it; destroyed with the plan.
struct CudaGemm::Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  bool available = true;  // false: no algorithm for these operand alignments (run_staged copies them)
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (layout_c != nullptr) cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_b != nullptr) cublasLtMatrixLayoutDestroy(layout_b);
    if (layout_a != nullptr) cublasLtMatrixLayoutDestroy(layout_a);
    if (operation != nullptr) cublasLtMatmulDescDestroy(operation);
  }
};

std::size_t CudaGemm::KeyHash::operator()(const Key& key) const {
  std::size_t hash = 0;
  const auto mix = [&hash](std::uint64_t value) {
    hash ^= std::hash<std::uint64_t>{}(value) + 0x9e3779b97f4a7c15ull + (hash << 6) + (hash >> 2);
  };
  mix(static_cast<std::uint64_t>(key.m));
  mix(static_cast<std::uint64_t>(key.n));
  mix(static_cast<std::uint64_t>(key.k));
  mix((key.transpose_a ? 1u : 0u) | (key.transpose_b ? 2u : 0u) | (key.accumulate ? 8u : 0u) |
      (static_cast<unsigned>(key.epilogue) << 12) | (static_cast<unsigned>(key.input) << 4) |
      (static_cast<unsigned>(key.output) << 8));
  mix((static_cast<std::uint64_t>(key.align_a) << 32) | (static_cast<std::uint64_t>(key.align_b) << 16) | key.align_c);
  mix((static_cast<std::uint64_t>(key.align_bias) << 32) | key.align_aux);
  mix(static_cast<std::uint64_t>(key.aux_ld));
  return hash;
}

CudaGemm::CudaGemm(cudaStream_t stream, bool allow_tf32) : stream_(stream), allow_tf32_(allow_tf32) {
  HPCTRAIN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  HPCTRAIN_CUDA_CHECK(cudaMalloc(&workspace_, workspace_size));
  workspace_bytes_ = workspace_size;
}

CudaGemm::~CudaGemm() {
  plans_.clear();
  if (workspace_ != nullptr) HPCTRAIN_CUDA_WARN(cudaFree(workspace_));
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void CudaGemm::allow_tf32(bool allowed) {
  if (allowed == allow_tf32_) return;
  allow_tf32_ = allowed;
  plans_.clear();  // their compute type was chosen with the other setting
}

CudaGemm::Plan& CudaGemm::plan_for(const Key& key, const void* bias, const void* aux) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return *found->second;
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute =
      key.input == DType::f32 && allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->operation, compute, CUDA_R_32F));
  // cuBLASLt's A is our b, its B our a (column-major view of row-major data).
  const cublasOperation_t operation_a = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t operation_b = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, operation_a);
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, operation_b);
  if (key.epilogue != Epilogue::none) {
    set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE, cublas_epilogue(key.epilogue));
    // The heuristic reads the pointers' values for their alignment; each call sets them again.
    if (bias != nullptr) set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (key.aux_ld > 0) {
      set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
      set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.aux_ld);
    }
  }
  const cudaDataType_t input = cuda_type(key.input), output = cuda_type(key.output);
  const std::int64_t m = key.m, n = key.n, k = key.k;
  // Stored shapes, column-major: our b is (n, k) [or (k, n) when transposed], our a (k, m) [or (m, k)].
  const std::uint64_t rows_a = key.transpose_b ? k : n, cols_a = key.transpose_b ? n : k;
  const std::uint64_t rows_b = key.transpose_a ? m : k, cols_b = key.transpose_a ? k : m;
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_a, input, rows_a, cols_a, rows_a));
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_b, input, rows_b, cols_b, rows_b));
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_c, output, n, m, n));

  cublasLtMatmulPreference_t preference = nullptr;
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  try {
    set_preference(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(workspace_bytes_));
    set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
    set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
    set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    // NOT_SUPPORTED means "no algorithm for this configuration": handled below like zero results.
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle_, plan->operation, plan->layout_a, plan->layout_b, plan->layout_c,
                                       plan->layout_c, preference, 1, &result, &returned);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED)
      returned = 0;
    else
      HPCTRAIN_CUBLAS_CHECK(status);
  } catch (...) {
    cublasLtMatmulPreferenceDestroy(preference);  // the first error is the one to report
    throw;
  }
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  const bool all_aligned = key.align_a >= 16 && key.align_b >= 16 && key.align_c >= 16;
  // A plain product of aligned operands must have an algorithm; a fused epilogue may not (the caller composes).
  const bool fused = key.epilogue != Epilogue::none && key.epilogue != Epilogue::bias;
  HPCTRAIN_VERIFY(returned > 0 || !all_aligned || fused, NotSupported,
                  "cuBLASLt has no algorithm for a " << m << "x" << n << "x" << k << " " << dtype_name(key.input)
                                                     << " product into " << dtype_name(key.output),
                  ErrorScope::this_rank);
  plan->available = returned > 0;
  plan->algorithm = result.algo;
  return *plans_.emplace(key, std::move(plan)).first->second;
}

void CudaGemm::execute(Plan& plan, const TensorView& a, const TensorView& b, const TensorView& c, bool accumulate,
                       const void* addend) {
  const float alpha = 1.0f, beta = accumulate || addend != nullptr ? 1.0f : 0.0f;
  const void* source_c = addend != nullptr ? addend : c.data;
  HPCTRAIN_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.operation, &alpha, b.data, plan.layout_a, a.data, plan.layout_b,
                                       &beta, source_c, plan.layout_c, c.data, plan.layout_c, &plan.algorithm,
                                       workspace_, workspace_bytes_, stream_));
}

namespace {
// The shapes of c = op(a) op(b): (m, n, k), checked.
struct Shape {
  std::int64_t m, n, k;
};
Shape product_shape(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c) {
  // a: (m, k) or stored (k, m); b: (k, n) or stored (n, k); c: (m, n).
  const std::int64_t m = transpose_a ? a.cols : a.rows;
  const std::int64_t k = transpose_a ? a.rows : a.cols;
  const std::int64_t n = transpose_b ? b.rows : b.cols;
  const std::int64_t k_of_b = transpose_b ? b.cols : b.rows;
  HPCTRAIN_ASSERT(k == k_of_b && c.rows == m && c.cols == n,
                  "gemm: shapes do not match: a " << a.rows << "x" << a.cols << (transpose_a ? "^T" : "") << ", b "
                                                  << b.rows << "x" << b.cols << (transpose_b ? "^T" : "") << ", c "
                                                  << c.rows << "x" << c.cols);
  HPCTRAIN_ASSERT(a.dtype == b.dtype, "gemm: a is " << dtype_name(a.dtype) << ", b is " << dtype_name(b.dtype));
  const bool supported = c.dtype == a.dtype || c.dtype == DType::f32;
  if (!supported || a.dtype == DType::f64)
    throw NotSupported(std::string("gemm with ") + dtype_name(a.dtype) + " inputs and a " + dtype_name(c.dtype) +
                       " output on the CUDA backend");
  return {m, n, k};
}

// The plan key of a product: its shape, operand layout, epilogue, types and the alignment of every pointer (a bias
// pointer of 0 alignment when there is none).
CudaGemm::Key key_of(const Shape& shape, bool transpose_a, bool transpose_b, bool accumulate,
                     CudaGemm::Epilogue epilogue, const TensorView& a, const TensorView& b, const TensorView& c,
                     const void* bias, const void* aux = nullptr, std::int64_t aux_ld = 0) {
  return {shape.m,
          shape.n,
          shape.k,
          transpose_a,
          transpose_b,
          accumulate,
          epilogue,
          a.dtype,
          c.dtype,
          alignment_of(a.data),
          alignment_of(b.data),
          alignment_of(c.data),
          bias != nullptr ? alignment_of(bias) : 0u,
          aux != nullptr ? alignment_of(aux) : 0u,
          aux != nullptr ? aux_ld : 0};
}

// The epilogue paths have no staged fallback: every operand (and the bias and aux, when there are) 16-byte aligned.
bool epilogue_aligned(const CudaGemm::Key& key, const void* bias, const void* aux = nullptr) {
  return key.align_a >= 16 && key.align_b >= 16 && key.align_c >= 16 && (bias == nullptr || key.align_bias >= 16) &&
         (aux == nullptr || key.align_aux >= 16);
}
}  // namespace

void CudaGemm::run(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
                   const void* bias, bool accumulate) {
  const Shape shape = product_shape(a, transpose_a, b, transpose_b, c);
  if (shape.m == 0 || shape.n == 0) return;
  HPCTRAIN_ASSERT(shape.k > 0, "gemm: empty inner dimension");
  const Key key = key_of(shape, transpose_a, transpose_b, accumulate, bias != nullptr ? Epilogue::bias : Epilogue::none,
                         a, b, c, bias);
  Plan& plan = plan_for(key, bias);
  if (!plan.available) return run_staged(a, transpose_a, b, transpose_b, c, bias, accumulate);
  if (bias != nullptr) set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  execute(plan, a, b, c, accumulate);
}

bool CudaGemm::run_with_bias_gradient(const TensorView& a, const TensorView& b, const TensorView& c,
                                      void* bias_gradient) {
  const Shape shape = product_shape(a, true, b, false, c);
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return false;
  const Key key = key_of(shape, true, false, false, Epilogue::bias_gradient, a, b, c, bias_gradient);
  if (!epilogue_aligned(key, bias_gradient)) return false;
  Plan& plan = plan_for(key, bias_gradient);
  if (!plan.available) return false;
  set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias_gradient));
  execute(plan, a, b, c, false);
  return true;
}

bool CudaGemm::run_fused(const TensorView& a, bool transpose_b, const TensorView& b, const TensorView& c,
                         const void* bias, Epilogue epilogue, const void* aux, std::int64_t aux_ld) {
  const Shape shape = product_shape(a, false, b, transpose_b, c);
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return false;
  const Key key = key_of(shape, false, transpose_b, false, epilogue, a, b, c, bias, aux, aux_ld);
  if (!epilogue_aligned(key, bias, aux)) return false;
  Plan& plan = plan_for(key, bias, aux);
  if (!plan.available) return false;
  if (bias != nullptr) set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux != nullptr) set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  execute(plan, a, b, c, false);
  return true;
}

bool CudaGemm::run_with_addend(const TensorView& a, const TensorView& b, const TensorView& c, const void* bias,
                               const void* addend) {
  HPCTRAIN_ASSERT(addend != nullptr && addend != c.data, "gemm: the addend is missing or aliases c");
  const Shape shape = product_shape(a, false, b, true, c);
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return false;
  // The addend's alignment stands in the aux slot of the key (this product has no aux); C's layout is D's.
  CudaGemm::Key key =
      key_of(shape, false, true, true, bias != nullptr ? Epilogue::bias : Epilogue::none, a, b, c, bias);
  key.align_aux = alignment_of(addend);
  if (!epilogue_aligned(key, bias) || key.align_aux < 16) return false;
  Plan& plan = plan_for(key, bias);
  if (!plan.available) return false;
  if (bias != nullptr) set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  execute(plan, a, b, c, true, addend);
  return true;
}

bool CudaGemm::run_activated(const TensorView& a, const TensorView& b, const TensorView& c, const void* bias,
                             Epilogue epilogue, void* aux, std::int64_t aux_ld) {
  const bool with_aux = epilogue == Epilogue::relu_aux || epilogue == Epilogue::relu_aux_bias ||
                        epilogue == Epilogue::gelu_aux || epilogue == Epilogue::gelu_aux_bias;
  const bool with_bias =
      epilogue == Epilogue::relu_bias || epilogue == Epilogue::relu_aux_bias || epilogue == Epilogue::gelu_aux_bias;
  HPCTRAIN_ASSERT(with_aux || epilogue == Epilogue::relu || epilogue == Epilogue::relu_bias,
                  "gemm: epilogue " << static_cast<int>(epilogue) << " is not a forward activation");
  HPCTRAIN_ASSERT(with_bias == (bias != nullptr) && with_aux == (aux != nullptr && aux_ld > 0),
                  "gemm: the epilogue's bias or aux is missing or extra");
  return run_fused(a, true, b, c, bias, epilogue, with_aux ? aux : nullptr, with_aux ? aux_ld : 0);
}

bool CudaGemm::run_with_activation_gradient(const TensorView& a, const TensorView& b, const TensorView& c,
                                            Epilogue epilogue, const void* aux, std::int64_t aux_ld) {
  HPCTRAIN_ASSERT((epilogue == Epilogue::drelu || epilogue == Epilogue::dgelu) && aux != nullptr && aux_ld > 0,
                  "gemm: an activation gradient needs DRELU or DGELU and the forward's aux");
  return run_fused(a, false, b, c, nullptr, epilogue, aux, aux_ld);
}

// Operands at addresses no algorithm accepts (views at odd offsets into a flat buffer) are copied into 256-byte
// aligned staging buffers, and the output copied back: a fallback, cached per shape like any plan. The staging
// buffers only grow and retire the blocks they replace (a captured graph may still use them).
void CudaGemm::run_staged(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b,
                          const TensorView& c, const void* bias, bool accumulate) {
  const auto stage = [&](DeviceScratch& staging, const TensorView& view, bool copy_in) {
    TensorView staged = view;
    if (alignment_of(view.data) >= 16) return staged;
    staged.data = staging.reserve(view.bytes());
    if (copy_in)
      HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(staged.data, view.data, view.bytes(), cudaMemcpyDeviceToDevice, stream_));
    return staged;
  };
  const TensorView staged_a = stage(staging_[0], a, true);
  const TensorView staged_b = stage(staging_[1], b, true);
  const TensorView staged_c = stage(staging_[2], c, accumulate);
  run(staged_a, transpose_a, staged_b, transpose_b, staged_c, bias, accumulate);
  if (staged_c.data != c.data)
    HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(c.data, staged_c.data, c.bytes(), cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace hpctrain::cuda
