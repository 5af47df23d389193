// Helpers shared by the kernel tests: seeded random inputs, tensors in backend memory written from and read back as
// double, NaN poisoning of outputs, a relative-norm error that never lets NaN pass, per-dtype tolerances and central
// finite differences. Written against the Backend interface only, so the same checks can run on any backend.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hpctrain/core/dtype.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::test_support {

inline const std::vector<DType> all_dtypes = {DType::f32, DType::bf16, DType::f16, DType::f64};

// An attention geometry with PyTorch's scale 1 / sqrt(head_dim), and its description for failure messages.
inline AttentionGeometry make_attention(std::int64_t batch, std::int64_t sequence, std::int64_t heads,
                                        std::int64_t head_dim, bool causal) {
  return {batch, sequence, heads, head_dim, causal, static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))),
          {}};
}
inline std::string describe(const AttentionGeometry& g, DType dtype) {
  return std::string(dtype_name(dtype)) + " batch " + std::to_string(g.batch) + " sequence " +
         std::to_string(g.sequence) + " heads " + std::to_string(g.heads) + " head_dim " + std::to_string(g.head_dim) +
         (g.causal ? " causal" : " not causal");
}

// The master dtype that goes with a storage dtype (f64 in gradient checks, f32 otherwise).
inline DType master_of(DType storage) { return storage == DType::f64 ? DType::f64 : DType::f32; }

// Relative-norm tolerance of a result stored in `dtype` (rounding of the output dominates).
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 1e-5;
    case DType::bf16:
      return 1e-2;
    case DType::f16:
      return 1e-3;
    case DType::f64:
      return 1e-12;
  }
  return 0.0;
}

// Uniform values in [low, high) from a fixed seed.
inline std::vector<double> random_values(std::size_t count, std::uint64_t seed, double low = -1.0, double high = 1.0) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> distribution(low, high);
  std::vector<double> values(count);
  for (double& value : values) value = distribution(generator);
  return values;
}

// Moves values within `gap` of `kink` out to kink +- gap (finite differences across a kink are meaningless).
inline std::vector<double> away_from(std::vector<double> values, double kink, double gap) {
  for (double& value : values)
    if (std::abs(value - kink) < gap) value = value < kink ? kink - gap : kink + gap;
  return values;
}

// ---- values <-> storage ----
inline void encode(DType dtype, const std::vector<double>& values, void* out) {
  dispatch_dtype(dtype, [&]<class T>() {
    T* typed = static_cast<T*>(out);
    for (std::size_t i = 0; i < values.size(); ++i) {
      if constexpr (std::is_same_v<T, double>) {
        typed[i] = values[i];
      } else {
        typed[i] = store<T>(static_cast<float>(values[i]));
      }
    }
  });
}

inline std::vector<double> decode(DType dtype, const void* in, std::size_t count) {
  std::vector<double> values(count);
  dispatch_dtype(dtype, [&]<class T>() {
    const T* typed = static_cast<const T*>(in);
    for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<double>(load(typed[i]));
  });
  return values;
}

// The values as they are after storing them in `dtype`.
inline std::vector<double> quantized(DType dtype, const std::vector<double>& values) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(dtype));
  encode(dtype, values, bytes.data());
  return decode(dtype, bytes.data(), values.size());
}

// ---- backend memory ----
class BackendBuffer {
 public:
  BackendBuffer(Backend& backend, std::size_t bytes)
      : backend_(&backend), data_(backend.allocate(bytes)), bytes_(bytes) {}
  ~BackendBuffer() {
    if (data_ != nullptr) backend_->deallocate(data_);
  }
  BackendBuffer(BackendBuffer&& other) noexcept
      : backend_(other.backend_), data_(std::exchange(other.data_, nullptr)), bytes_(other.bytes_) {}
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  BackendBuffer& operator=(BackendBuffer&&) = delete;

  [[nodiscard]] void* data() const { return data_; }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }
  void upload(const void* host) { backend_->copy_to_backend(data_, host, bytes_); }
  void download(void* host) const {
    backend_->synchronize();
    backend_->copy_to_host(host, data_, bytes_);
  }

 private:
  Backend* backend_;
  void* data_;
  std::size_t bytes_;
};

// A (rows, cols) matrix of one dtype in backend memory.
class TestTensor {
 public:
  TestTensor(Backend& backend, DType dtype, std::int64_t rows, std::int64_t cols)
      : buffer_(backend, static_cast<std::size_t>(rows * cols) * dtype_size(dtype)),
        dtype_(dtype),
        rows_(rows),
        cols_(cols) {}

  [[nodiscard]] TensorView view() const { return {buffer_.data(), dtype_, rows_, cols_}; }
  [[nodiscard]] void* data() const { return buffer_.data(); }
  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(rows_ * cols_); }

  // Stores the values (rounded to the dtype).
  void set(const std::vector<double>& values) {
    EXPECT_EQ(values.size(), size());
    std::vector<unsigned char> bytes(buffer_.bytes());
    encode(dtype_, values, bytes.data());
    buffer_.upload(bytes.data());
  }
  // Stores random values and returns them as stored (dequantised).
  std::vector<double> randomize(std::uint64_t seed, double low = -1.0, double high = 1.0) {
    const auto values = quantized(dtype_, random_values(size(), seed, low, high));
    set(values);
    return values;
  }
  [[nodiscard]] std::vector<double> get() const {
    std::vector<unsigned char> bytes(buffer_.bytes());
    buffer_.download(bytes.data());
    return decode(dtype_, bytes.data(), size());
  }
  // Fills with NaN, so an output the kernel forgets to write cannot pass.
  void poison() { set(std::vector<double>(size(), std::numeric_limits<double>::quiet_NaN())); }

 private:
  BackendBuffer buffer_;
  DType dtype_;
  std::int64_t rows_, cols_;
};

// A plain array of T in backend memory (labels, sample ids, scalars, flat fp32 buffers).
template <class T>
class TestArray {
 public:
  TestArray(Backend& backend, std::size_t count) : buffer_(backend, count * sizeof(T)), count_(count) {}
  TestArray(Backend& backend, const std::vector<T>& values) : TestArray(backend, values.size()) { set(values); }
  [[nodiscard]] T* data() const { return static_cast<T*>(buffer_.data()); }
  void set(const std::vector<T>& values) {
    EXPECT_EQ(values.size(), count_);
    buffer_.upload(values.data());
  }
  [[nodiscard]] std::vector<T> get() const {
    std::vector<T> values(count_);
    buffer_.download(values.data());
    return values;
  }

 private:
  BackendBuffer buffer_;
  std::size_t count_;
};

// ---- comparisons ----
// ||got - want|| / ||want|| (absolute when want is zero); +inf when got has a NaN or Inf that want does not, so a
// poisoned output never passes.
inline double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double difference = 0.0, reference = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return std::numeric_limits<double>::infinity();
    difference += (got[i] - want[i]) * (got[i] - want[i]);
    reference += want[i] * want[i];
  }
  return reference > 0.0 ? std::sqrt(difference / reference) : std::sqrt(difference);
}

inline bool has_nan(const std::vector<double>& values) {
  for (double value : values)
    if (std::isnan(value)) return true;
  return false;
}

// Central differences of objective() with respect to every entry of `point`; objective reads `point` (restored after
// each entry).
template <class Objective>
std::vector<double> central_differences(std::vector<double>& point, double step, Objective&& objective) {
  std::vector<double> gradient(point.size());
  for (std::size_t i = 0; i < point.size(); ++i) {
    const double saved = point[i];
    point[i] = saved + step;
    const double above = objective();
    point[i] = saved - step;
    const double below = objective();
    point[i] = saved;
    gradient[i] = (above - below) / (2.0 * step);
  }
  return gradient;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// A geometry from its parts; output extents computed as PyTorch does.
inline SpatialGeometry make_geometry(int dimensions, std::int64_t in_channels, std::int64_t out_channels,
                                     std::int64_t groups, std::array<std::int64_t, 3> input,
                                     std::array<std::int64_t, 3> kernel, std::array<std::int64_t, 3> stride,
                                     std::array<std::int64_t, 3> padding, std::array<std::int64_t, 3> dilation) {
  SpatialGeometry g{dimensions, in_channels, out_channels, groups, input, {}, kernel, stride, padding, dilation};
  for (std::size_t a = 0; a < static_cast<std::size_t>(dimensions); ++a)
    g.output[a] = (input[a] + 2 * padding[a] - dilation[a] * (kernel[a] - 1) - 1) / stride[a] + 1;
  return g;
}

inline std::string describe(const SpatialGeometry& g) {
  std::string text = std::to_string(g.dimensions) + "-D " + std::to_string(g.in_channels) + "->" +
                     std::to_string(g.out_channels) + " groups " + std::to_string(g.groups) + " input";
  for (int a = 0; a < g.dimensions; ++a) text += " " + std::to_string(g.input[static_cast<std::size_t>(a)]);
  text += " kernel " + std::to_string(g.kernel[0]) + " stride " + std::to_string(g.stride[0]) + " padding " +
          std::to_string(g.padding[0]) + " dilation " + std::to_string(g.dilation[0]);
  return text;
}

}  // namespace hpctrain::test_support
