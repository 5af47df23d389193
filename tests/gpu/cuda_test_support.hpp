// The harness of the CUDA-vs-CPU tests: matrices and arrays held by both backends with the same contents, and a
// fixture that skips without a GPU (HPCTRAIN_GPU_TEST_SELF_CHECK=1 puts a second CPU backend in the GPU's place, so
// the harness itself is checked on machines without one).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {

using namespace test_support;  // NOLINT(google-build-using-namespace): test harness

const std::vector<DType> gpu_dtypes = {DType::f32, DType::bf16, DType::f16};
constexpr Activation all_activations[] = {Activation::relu, Activation::gelu, Activation::tanh, Activation::leaky_relu,
                                          Activation::gelu_tanh};

// A matrix held by both backends with the same contents.
class TensorPair {
 public:
  TensorPair(Backend& cpu, Backend& gpu, DType dtype, std::int64_t rows, std::int64_t cols)
      : cpu_(cpu, dtype, rows, cols), gpu_(gpu, dtype, rows, cols), dtype_(dtype) {}
  std::vector<double> randomize(std::uint64_t seed, double low = -1.0, double high = 1.0) {
    const auto values = cpu_.randomize(seed, low, high);
    gpu_.set(values);
    return values;
  }
  void set(const std::vector<double>& values) {
    cpu_.set(values);
    gpu_.set(values);
  }
  void poison() {
    cpu_.poison();
    gpu_.poison();
  }
  [[nodiscard]] TensorView cpu() const { return cpu_.view(); }
  [[nodiscard]] TensorView gpu() const { return gpu_.view(); }
  // Relative-norm difference of the two backends' contents (+inf on NaN/Inf).
  [[nodiscard]] double difference() const { return relative_error(gpu_.get(), cpu_.get()); }
  [[nodiscard]] bool identical() const { return gpu_.get() == cpu_.get() && !has_nan(cpu_.get()); }
  // Elements [first, last) of each side.
  [[nodiscard]] std::vector<double> cpu_values(std::size_t first, std::size_t last) const {
    return part(cpu_, first, last);
  }
  [[nodiscard]] std::vector<double> gpu_values(std::size_t first, std::size_t last) const {
    return part(gpu_, first, last);
  }
  [[nodiscard]] DType dtype() const { return dtype_; }

 private:
  static std::vector<double> part(const TestTensor& tensor, std::size_t first, std::size_t last) {
    const auto all = tensor.get();
    return {all.begin() + static_cast<std::ptrdiff_t>(first), all.begin() + static_cast<std::ptrdiff_t>(last)};
  }
  TestTensor cpu_, gpu_;
  DType dtype_;
};

// A plain array held by both backends.
template <class T>
class ArrayPair {
 public:
  ArrayPair(Backend& cpu, Backend& gpu, const std::vector<T>& values) : cpu_(cpu, values), gpu_(gpu, values) {}
  void set(const std::vector<T>& values) {
    cpu_.set(values);
    gpu_.set(values);
  }
  [[nodiscard]] T* cpu() const { return cpu_.data(); }
  [[nodiscard]] T* gpu() const { return gpu_.data(); }
  [[nodiscard]] std::vector<T> cpu_values() const { return cpu_.get(); }
  [[nodiscard]] std::vector<T> gpu_values() const { return gpu_.get(); }
  [[nodiscard]] double difference() const {
    const auto want = cpu_.get(), got = gpu_.get();
    return relative_error(std::vector<double>(got.begin(), got.end()), std::vector<double>(want.begin(), want.end()));
  }

 private:
  TestArray<T> cpu_, gpu_;
};

inline std::vector<float> random_floats(std::size_t count, std::uint64_t seed, double low = -1.0, double high = 1.0) {
  const auto values = random_values(count, seed, low, high);
  return {values.begin(), values.end()};
}

inline const float nan_float = std::numeric_limits<float>::quiet_NaN();

class CudaVsCpu : public ::testing::Test {
 protected:
  // HPCTRAIN_GPU_TEST_SELF_CHECK=1 puts a second CPU backend in the GPU's place: checks this harness (every comparison
  // must pass against itself) on machines without a GPU.
  void SetUp() override {
    if (self_check()) {
      gpu = make_cpu_backend();
      return;
    }
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    gpu = make_cuda_backend(0);
  }
  static bool self_check() { return std::getenv("HPCTRAIN_GPU_TEST_SELF_CHECK") != nullptr; }
  TensorPair pair(DType dtype, std::int64_t rows, std::int64_t cols) { return {*cpu, *gpu, dtype, rows, cols}; }
  template <class T>
  ArrayPair<T> array(const std::vector<T>& values) {
    return {*cpu, *gpu, values};
  }
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu;
};

}  // namespace hpctrain
