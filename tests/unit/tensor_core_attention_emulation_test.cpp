// The tensor-core attention kernels' own code (src/kernels/cuda/tensor_core_attention_kernels.inc) run on the CPU,
// against the f64 reference: a block is 128 fibres (ucontext) switched at every barrier in thread order, and the warp's
// collective operations are emulated from the PTX ISA's description: mma.m16n8k16 gathers the 32 lanes' fragments into
// the whole A (16 x 16) and B (16 x 8) by the documented layouts, independently of how the kernels load them, and
// every lane takes its accumulators back by the documented C layout; shuffles exchange through the same barrier.
// So the tiles, masks, fragment loads, the accumulator-to-operand reuse, online softmax, tails and loop bounds are
// checked on machines without a GPU; what this cannot check is the hardware itself (the real mma, shared-memory
// races, the compiler), which tests/gpu/cuda_tensor_core_attention_test.cpp does on a GPU.
// bf16 and fp16, causal and not, T in {1, 63, 64, 130}, head_dim 32, 64 and 128 (its 32-row backward tiles), several
// heads and sequences, outputs poisoned with NaN; relative-norm tolerances as on the GPU.
#include <gtest/gtest.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "attention_reference.hpp"
#include "hpctrain/core/half.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda/attention_plan.hpp"
#include "kernel_test_support.hpp"

// GCC says so with __SANITIZE_*__, clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HPCTRAIN_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HPCTRAIN_UNDER_SANITIZER 1
#endif
#endif

namespace hpctrain::cuda::emulation {
namespace {

// ---- one block of tc_threads fibres ----
struct alignas(16) Chunk {
  std::uint32_t word[4];
};

class BlockEmulator {
 public:
  // Runs body() once per thread of block (x, y); false when the threads disagreed on the barriers (some ended while
  // others waited).
  bool run(std::int64_t x, std::int64_t y, const std::function<void()>& body) {
    block_x_ = x;
    block_y_ = y;
    body_ = &body;
    for (int t = 0; t < tc_threads; ++t) {
      Fiber& fiber = fibers_[t];
      fiber.stack.resize(256 * 1024);
      fiber.done = false;
      getcontext(&fiber.context);
      fiber.context.uc_stack.ss_sp = fiber.stack.data();
      fiber.context.uc_stack.ss_size = fiber.stack.size();
      fiber.context.uc_link = &scheduler_;
      makecontext(&fiber.context, &BlockEmulator::entry, 0);
    }
    for (;;) {  // a round: every thread runs to its next barrier (or its end)
      ++round_;
      for (current_ = 0; current_ < tc_threads; ++current_)
        if (!fibers_[current_].done) swapcontext(&scheduler_, &fibers_[current_].context);
      const auto ended = std::count_if(fibers_.begin(), fibers_.end(), [](const Fiber& f) { return f.done; });
      if (ended == tc_threads) return true;
      if (ended != 0) return false;  // a barrier not every thread reached: a deadlock on the GPU
    }
  }

  [[nodiscard]] int thread() const { return current_; }
  [[nodiscard]] std::int64_t block_x() const { return block_x_; }
  [[nodiscard]] std::int64_t block_y() const { return block_y_; }
  void barrier() { swapcontext(&fibers_[current_].context, &scheduler_); }

  // Warp collectives: every lane deposits, a barrier, every lane reads, a barrier (so nothing is overwritten early).
  float shuffle_xor(float value, int lane_mask) {
    slots_[current_].value = value;
    barrier();
    const float other = slots_[current_ / 32 * 32 + ((current_ % 32) ^ lane_mask)].value;
    barrier();
    return other;
  }

  template <class T>
  void mma(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
    Slot& mine = slots_[current_];
    std::copy(a, a + 4, mine.a);
    std::copy(b, b + 2, mine.b);
    barrier();
    const int warp = current_ / 32, lane = current_ % 32;
    if (lane == 0) warp_product<T>(warp);  // lane 0 runs first in a round: the warp's A B for every lane
    const int group = lane / 4, member = lane % 4;
    for (int i = 0; i < 4; ++i) c[i] += products_[warp][i < 2 ? group : group + 8][2 * member + (i & 1)];
    barrier();
  }

 private:
  struct Fiber {
    ucontext_t context{};
    std::vector<char> stack;
    bool done = false;
  };
  struct Slot {
    std::uint32_t a[4] = {}, b[2] = {};
    float value = 0.0f;
  };

  static void entry();

  template <class T>
  static float half_of(std::uint32_t word, int which) {
    const auto bits = static_cast<std::uint16_t>(which == 0 ? word & 0xffffu : word >> 16);
    return to_float(T{bits});
  }

  // PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type": groupID = lane >> 2, threadID_in_group =
  // lane % 4; A element a_i (i = 0..7, two per register, low half first): row groupID for i < 2 or 4 <= i < 6, else
  // groupID + 8; column 2 threadID_in_group + (i & 1), + 8 for i >= 4. B element b_i (i = 0..3): row 2
  // threadID_in_group + (i & 1), + 8 for i >= 2; column groupID.
  template <class T>
  void warp_product(int warp) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    float a[16][16], b[16][8];
    std::fill(&a[0][0], &a[0][0] + 16 * 16, nan);  // an element no lane supplied poisons the product
    std::fill(&b[0][0], &b[0][0] + 16 * 8, nan);
    for (int lane = 0; lane < 32; ++lane) {
      const Slot& slot = slots_[warp * 32 + lane];
      const int group = lane / 4, member = lane % 4;
      for (int i = 0; i < 8; ++i) {
        const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
        const int col = 2 * member + (i & 1) + (i >= 4 ? 8 : 0);
        a[row][col] = half_of<T>(slot.a[i / 2], i % 2);
      }
      for (int i = 0; i < 4; ++i) b[2 * member + (i & 1) + (i >= 2 ? 8 : 0)][group] = half_of<T>(slot.b[i / 2], i % 2);
    }
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) {
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) sum += a[row][k] * b[k][col];
        products_[warp][row][col] = sum;
      }
  }

  ucontext_t scheduler_{};
  std::vector<Fiber> fibers_ = std::vector<Fiber>(tc_threads);
  std::vector<Slot> slots_ = std::vector<Slot>(tc_threads);
  float products_[tc_warps][16][8] = {};
  const std::function<void()>* body_ = nullptr;
  int current_ = 0;
  long round_ = 0;
  std::int64_t block_x_ = 0, block_y_ = 0;
};

BlockEmulator* emulator = nullptr;  // the block being run (one at a time)

void BlockEmulator::entry() {
  (*emulator->body_)();
  emulator->fibers_[emulator->current_].done = true;
}  // returns to uc_link: the scheduler

// ---- the primitives of tensor_core_attention_kernels.inc, on the emulator ----
#define TC_INLINE inline
#define TC_UNROLL
int tc_thread() { return emulator->thread(); }
std::int64_t tc_block_x() { return emulator->block_x(); }
std::int64_t tc_block_y() { return emulator->block_y(); }
void tc_sync_block() { emulator->barrier(); }
float tc_shuffle_xor(float value, int lane_mask) { return emulator->shuffle_xor(value, lane_mask); }
template <class T>
std::uint32_t pack_pair(float low, float high) {
  if constexpr (std::is_same_v<T, bf16>)
    return static_cast<std::uint32_t>(to_bf16(low).bits) | static_cast<std::uint32_t>(to_bf16(high).bits) << 16;
  else
    return static_cast<std::uint32_t>(to_fp16(low).bits) | static_cast<std::uint32_t>(to_fp16(high).bits) << 16;
}
template <class T>
void mma_16x8x16(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  emulator->mma<T>(c, a, b);
}
using TcChunk = Chunk;

#include "../../src/kernels/cuda/tensor_core_attention_kernels.inc"
#undef TC_INLINE
#undef TC_UNROLL

// ---- the three launches of the backend (tensor_core_attention.cu), emulated ----
template <class T>
struct Buffer {  // 16-byte aligned, as device allocations are
  explicit Buffer(std::size_t count) : chunks((count * sizeof(T) + 15) / 16), size(count) {}
  T* data() { return reinterpret_cast<T*>(chunks.data()); }
  std::vector<Chunk> chunks;
  std::size_t size;
};

template <class T>
Buffer<T> stored(const std::vector<double>& values) {
  Buffer<T> buffer(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) buffer.data()[i] = store<T>(static_cast<float>(values[i]));
  return buffer;
}
template <class T>
Buffer<T> poisoned(std::size_t count) {
  return stored<T>(std::vector<double>(count, std::numeric_limits<double>::quiet_NaN()));
}
template <class T>
std::vector<double> values_of(Buffer<T>& buffer) {
  std::vector<double> values(buffer.size);
  for (std::size_t i = 0; i < buffer.size; ++i) values[i] = load(buffer.data()[i]);
  return values;
}

struct Emulated {
  std::vector<double> out, lse, dqkv;
  bool barriers_agree = true;
};

template <class T, int D>
Emulated emulate(const AttentionGeometry& g, const std::vector<double>& qkv_values,
                 const std::vector<double>& dout_values) {
  BlockEmulator block;
  emulator = &block;
  const std::int64_t rows = g.batch * g.sequence, lse_count = g.batch * g.heads * g.sequence;
  auto qkv = stored<T>(qkv_values), dout = stored<T>(dout_values);
  auto out = poisoned<T>(static_cast<std::size_t>(rows * g.width()));
  auto dqkv = poisoned<T>(qkv_values.size());
  std::vector<float> lse(static_cast<std::size_t>(lse_count), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> delta(lse.size(), std::numeric_limits<float>::quiet_NaN());
  const TensorCoreGrid grid = tc_grid(g.batch, g.heads, g.sequence);
  std::vector<Chunk> shared((std::max(tc_forward_shared_bytes(D), tc_backward_shared_bytes(D)) + 15) / 16);
  auto* tiles = reinterpret_cast<std::uint16_t*>(shared.data());
  std::fill(tiles, tiles + shared.size() * 8, std::uint16_t{0x7fc0});  // NaN in bf16 and fp16: unwritten tiles show
  Emulated result;
  const auto each_block = [&](const std::function<void()>& body) {
    for (std::int64_t x = 0; x < grid.x; ++x)
      for (std::int64_t y = 0; y < grid.y; ++y) result.barriers_agree = block.run(x, y, body) && result.barriers_agree;
  };
  each_block([&] { tc_forward_block<T, D>(g, qkv.data(), out.data(), lse.data(), tiles); });
  for (std::int64_t index = 0; index < lse_count; ++index)
    tc_delta_row<T, D>(g, out.data(), dout.data(), delta.data(), index);
  each_block([&] { tc_dkdv_block<T, D>(g, qkv.data(), dout.data(), lse.data(), delta.data(), dqkv.data(), tiles); });
  each_block([&] { tc_dq_block<T, D>(g, qkv.data(), dout.data(), lse.data(), delta.data(), dqkv.data(), tiles); });
  emulator = nullptr;
  result.out = values_of(out);
  result.lse.assign(lse.begin(), lse.end());
  result.dqkv = values_of(dqkv);
  return result;
}

template <class T>
Emulated emulate_any(const AttentionGeometry& g, const std::vector<double>& qkv, const std::vector<double>& dout) {
  switch (g.head_dim) {
    case 32:
      return emulate<T, 32>(g, qkv, dout);
    case 64:
      return emulate<T, 64>(g, qkv, dout);
    default:
      return emulate<T, 128>(g, qkv, dout);
  }
}

TEST(TensorCoreAttentionEmulation, ForwardAndGradientsAgainstF64) {
#if defined(HPCTRAIN_UNDER_SANITIZER)
  GTEST_SKIP() << "fibres (swapcontext) confuse the sanitizers' stack tracking";
#endif
  using test_support::make_attention;
  struct Case {
    AttentionGeometry g;
    DType dtype;
  };
  // Each T and head_dim once per dtype family, causal and not between them (the emulation costs ~0.3 ms per mma).
  const std::vector<Case> cases = {
      {make_attention(2, 130, 1, 64, true), DType::bf16},  {make_attention(1, 130, 2, 64, false), DType::f16},
      {make_attention(2, 63, 1, 64, false), DType::bf16},  {make_attention(1, 64, 2, 64, true), DType::f16},
      {make_attention(3, 1, 2, 64, true), DType::bf16},    {make_attention(1, 70, 2, 32, true), DType::f16},
      {make_attention(1, 70, 1, 128, false), DType::bf16}, {make_attention(1, 70, 1, 128, true), DType::f16},
  };
  for (const Case& c : cases) {
    const AttentionGeometry& g = c.g;
    const std::string where = test_support::describe(g, c.dtype);
    const std::int64_t rows = g.batch * g.sequence;
    const auto qkv =
        test_support::grid_values(static_cast<std::size_t>(rows * 3 * g.width()), 3 + g.sequence, 2.0, 64.0);
    const auto dout = test_support::grid_values(static_cast<std::size_t>(rows * g.width()), 5 + g.heads, 1.0, 128.0);
    const test_support::ReferenceAttention want = test_support::reference_attention(g, qkv, dout);
    const Emulated got = c.dtype == DType::bf16 ? emulate_any<bf16>(g, qkv, dout) : emulate_any<fp16>(g, qkv, dout);
    EXPECT_TRUE(got.barriers_agree) << where;
    const double tolerance = test_support::tolerance(c.dtype);
    const double out = test_support::relative_error(got.out, want.out);
    const double lse = test_support::relative_error(got.lse, want.lse);
    double gradients[3];
    for (int which = 0; which < 3; ++which)
      gradients[which] = test_support::relative_error(test_support::attention_part(got.dqkv, g.width(), which),
                                                      test_support::attention_part(want.dqkv, g.width(), which));
    std::printf("%s: out %.1e lse %.1e dQ %.1e dK %.1e dV %.1e\n", where.c_str(), out, lse, gradients[0], gradients[1],
                gradients[2]);
    EXPECT_LE(out, tolerance) << "out, " << where;
    EXPECT_LE(lse, 1e-5) << "lse, " << where;
    const char* names[] = {"dQ", "dK", "dV"};
    for (int which = 0; which < 3; ++which)
      EXPECT_LE(gradients[which], 1.5 * tolerance) << names[which] << ", " << where;
  }
}

}  // namespace
}  // namespace hpctrain::cuda::emulation
