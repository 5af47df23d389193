// Max pooling that keeps each output's first maximum for its backward (Backend::max_pooling_forward/backward, what a
// training step calls): the backward then reads the argmax instead of recomputing every window, and with windows that
// tile the input (stride = kernel, no padding: the usual 2x2(x2) pooling) it writes each dx element once, with no
// scatter buffer. The results are bit for bit those of pooling_forward/pooling_backward (cpu_spatial.cpp): the same
// first-maximum and NaN rules, the same additions in the same order.
//
// Tiling windows have loops of their own in both layouts and every dtype (issue 17: the general loops ran at 0.03-0.3x
// oneDNN's pooling on the decks' 2x2(x2) layers): plain loops over contiguous channels (channels-last) or along the
// output width (channels-first) with one compare and select per value, which GCC vectorises for any target; bf16 and
// fp16 compare integer keys of their bits (MaxOrder), so they are never widened. The hot blocks use GCC vector
// extensions (no intrinsics; lowered to narrower registers where the CPU lacks AVX-512). In f32 and f64 the
// channels-last vector loops first run a plain > per tap and sum the values; a thread whose sum is NaN does its share
// again by the exact rule (BlockPass, NanWatch).
//
// Gradients are stored straight from the compute type: they are sums that start at 0, so never a signalling NaN, and
// the round trip through double of the plain loops changes nothing for them. Winners are stored as the plain loops
// store them: f32 and f64 bit for bit (a signalling NaN stays one), bf16 and fp16 NaNs made canonical by store();
// tests/unit/max_pooling_test.cpp pins both. (No round trip through double for a winner: whether it quiets a
// signalling NaN depends on what the compiler folds, and differed between the release and sanitizer builds.)
//
// argmax has y's shape and layout (int32): the winning input position within the sample's plane, -1 for a window
// wholly in the padding. Threads own whole output rows (sample, depth, height) or planes, so no result depends on the
// thread count.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_common.hpp"
#include "cpu_spatial.hpp"
#include "hpctrain/core/error.hpp"

// The vector types are passed between this file's internal functions only: the warning that their ABI differs
// without AVX-512 (builds for any x86-64) concerns no caller.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace hpctrain::cpu {
namespace {

// Output rows (sample, od, oh) of a batch: the unit of work of the channels-last loops (the position arithmetic is
// done once per row, not per output).
struct OutputRow {
  std::int64_t n, d, h;
};
OutputRow output_row(const Box& b, std::int64_t row) {
  return {row / (b.out[0] * b.out[1]), row / b.out[1] % b.out[0], row % b.out[1]};
}

// The first-maximum rule as an integer key per value compared with a strict > in tap order: the magnitude bits,
// negated for negative values (so both zeros are 0: the first wins their tie), every NaN above +infinity (the first
// one sticks). Integer compares and selects only, so GCC vectorises the loops for any target and never widens bf16 or
// fp16. Also how the channels-last loops store a winner and a gradient, bit for bit as the plain loops do. The loops
// move Storage: the 16-bit types as their bits (GCC vectorises no struct copies).
template <class Bits, class Key, Bits infinity, class Storage>
Key max_key(Storage value) {
  constexpr Bits sign = Bits{1} << (8 * sizeof(Bits) - 1);
  const auto bits = std::bit_cast<Bits>(value);
  const auto magnitude = static_cast<Key>(bits & ~sign);
  return static_cast<Bits>(magnitude) > infinity ? std::numeric_limits<Key>::max()
         : (bits & sign) != 0                    ? static_cast<Key>(-magnitude)
                                                 : magnitude;
}

// f32, f64: winners stored as they are and gradients as 0 + dy, as the plain loops.
template <class T>
struct MaxOrder {
  using Storage = T;
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  using Key = std::make_signed_t<Bits>;
  static Key key(T value) { return max_key<Bits, Key, std::bit_cast<Bits>(std::numeric_limits<T>::infinity())>(value); }
  static T stored(T winner) { return winner; }
  static T gradient(T upstream) { return store<T>(compute_t<T>(0) + load(upstream)); }
};

// bf16, fp16: widening to f32 and back is exact except for NaNs, which store() makes the canonical NaN 0x7fff, and
// -0, which 0 + dy makes +0.
template <class T>
struct HalfMaxOrder {
  using Storage = std::uint16_t;
  using Key = std::int16_t;
  static constexpr Storage infinity = std::is_same_v<T, bf16> ? 0x7f80 : 0x7c00, canonical_nan = 0x7fff;
  static bool is_nan(Storage bits) { return (bits & 0x7fff) > infinity; }
  static Key key(Storage bits) { return max_key<Storage, Key, infinity>(bits); }
  static Storage stored(Storage winner) { return is_nan(winner) ? canonical_nan : winner; }
  static Storage gradient(Storage upstream) {
    return is_nan(upstream) ? canonical_nan : upstream == 0x8000 ? Storage{0} : upstream;
  }
};
template <>
struct MaxOrder<bf16> : HalfMaxOrder<bf16> {};
template <>
struct MaxOrder<fp16> : HalfMaxOrder<fp16> {};

// A tensor's values as the loops move them.
template <class T>
const typename MaxOrder<T>::Storage* storage_of(const TensorView& view) {
  return reinterpret_cast<const typename MaxOrder<T>::Storage*>(view.as<T>());
}
template <class T>
typename MaxOrder<T>::Storage* mutable_storage_of(const TensorView& view) {
  return reinterpret_cast<typename MaxOrder<T>::Storage*>(view.as<T>());
}

// A tiling window's taps in kernel order, as offsets in positions from its first one.
std::vector<std::int32_t> tiling_taps(const Box& b) {
  std::vector<std::int32_t> offsets;
  for (std::int64_t kd = 0; kd < b.kernel[0]; ++kd)
    for (std::int64_t kh = 0; kh < b.kernel[1]; ++kh)
      for (std::int64_t kw = 0; kw < b.kernel[2]; ++kw)
        offsets.push_back(static_cast<std::int32_t>((kd * b.in[1] + kh) * b.in[2] + kw));
  return offsets;
}

// The first position of tiling window (od, oh, ow).
std::int64_t window_origin(const Box& b, std::int64_t od, std::int64_t oh, std::int64_t ow) {
  return (od * b.kernel[0] * b.in[1] + oh * b.kernel[1]) * b.in[2] + ow * b.kernel[2];
}

// Calls visit(start, size) for blocks of count: of 16, then 8 and 4 (sizes as compile-time constants, so the loops
// over a block are whole vectors in registers), then the rest.
constexpr std::int64_t block = 16;
template <class Visit>
void for_each_block(std::int64_t count, Visit visit) {
  std::int64_t start = 0;
  for (; start + 16 <= count; start += 16) visit(start, std::integral_constant<std::int64_t, 16>{});
  if (start + 8 <= count) {
    visit(start, std::integral_constant<std::int64_t, 8>{});
    start += 8;
  }
  if (start + 4 <= count) {
    visit(start, std::integral_constant<std::int64_t, 4>{});
    start += 4;
  }
  if (start < count) visit(start, count - start);
}

// The channels-last forward's blocks are one register wide (vector_register_bytes): with 16-lane f32 blocks, 4 chains
// of them spilled on AVX2 (the 8- and 16-channel layers ran at 0.58-0.81x oneDNN's primitive on an AMD EPYC with
// AVX2). forward_lanes<T> channels (4 to 16), counted for the wider of the value and its int32 argmax.
template <class T>
constexpr std::size_t lane_bytes = std::max(sizeof(typename MaxOrder<T>::Storage), sizeof(std::int32_t));
template <class T>
constexpr int forward_lanes = static_cast<int>(std::clamp<std::size_t>(vector_register_bytes / lane_bytes<T>, 4, 16));

// The running first maximum of a block of windows: keys, winning values and positions, in registers.
template <class T>
struct BlockMaximum {
  using Order = MaxOrder<T>;
  typename Order::Key key[block];
  typename Order::Storage best[block];
  std::int32_t index[block];
  void set(std::int64_t i, typename Order::Storage value, std::int64_t position) {
    key[i] = Order::key(value);
    best[i] = value;
    index[i] = static_cast<std::int32_t>(position);
  }
  // value at position replaces the maximum when it beats it (a select, no branch).
  void merge(std::int64_t i, typename Order::Key value_key, typename Order::Storage value, std::int64_t position) {
    const bool take = value_key > key[i];
    key[i] = take ? value_key : key[i];
    best[i] = take ? value : best[i];
    index[i] = take ? static_cast<std::int32_t>(position) : index[i];
  }
};

// GCC/Clang vector extensions (no intrinsics: any target, split into narrower registers where the CPU has them): a
// block of L channels of the channels-last forward held in registers across a window's taps.
template <class E, int L>
struct VectorOf {
  typedef E type __attribute__((vector_size(sizeof(E) * L)));
};
template <class E, int L>
using Vector = typename VectorOf<E, L>::type;

// MaxOrder on a vector of storage bits: f32 and f64 compare as floats (three compares and two mask operations per
// tap, fewer than the integer key costs), bf16 and fp16 by the integer key.
template <class T, int L>
struct VectorMaxOrder {
  using Bits = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
  using Key = std::make_signed_t<Bits>;
  static constexpr bool floating = sizeof(T) > 2;
  static constexpr int lanes = L;
  using Element = std::conditional_t<floating, T, Key>;
  using B = Vector<Bits, L>;
  using K = Vector<Element, L>;
  static constexpr Bits sign = Bits{1} << (8 * sizeof(Bits) - 1);
  static constexpr Bits infinity = std::is_same_v<T, bf16>   ? 0x7f80
                                   : std::is_same_v<T, fp16> ? 0x7c00
                                                             : std::bit_cast<Bits>(std::numeric_limits<T>::infinity());
  static B load_bits(const void* source) {
    B bits;
    std::memcpy(&bits, source, sizeof bits);
    return bits;
  }
  static K key(B bits) {
    if constexpr (floating) {
      return reinterpret_cast<K>(bits);
    } else {
      const B magnitude = bits & static_cast<Bits>(~sign);
      const K value = reinterpret_cast<K>(magnitude);
      const K signed_value = reinterpret_cast<K>(bits) < 0 ? -value : value;
      return magnitude > infinity ? K{} + std::numeric_limits<Key>::max() : signed_value;
    }
  }
  // Lanes where value replaces best (replaces_best's rule: the best is not NaN and the value larger or NaN).
  static auto beats(K best, K value) {
    if constexpr (floating)
      return (best == best) & ((value > best) | (value != value));
    else
      return value > best;
  }
  // The winner as the plain loops store it: f32 and f64 as they are, bf16 and fp16 NaNs made canonical (store()).
  static B stored(B bits) {
    if constexpr (sizeof(T) == 2)
      return (bits & static_cast<Bits>(~sign)) > infinity ? B{} + Bits{0x7fff} : bits;
    else
      return bits;
  }
};

// Whether the sum of a vector's lanes is NaN (halves added until one lane is left: a few shuffles, where a test per
// lane would be a scalar compare each).
template <class E, int L>
bool sum_is_nan(Vector<E, L> v) {
  if constexpr (L == 1) {
    return v[0] != v[0];
  } else {
    Vector<E, L / 2> low, high;
    std::memcpy(&low, &v, sizeof low);
    std::memcpy(&high, reinterpret_cast<const char*>(&v) + sizeof low, sizeof high);
    return sum_is_nan<E, L / 2>(low + high);
  }
}

// The vector loops' two passes. f32 and f64 first take a plain strict > per tap (one compare and two selects; the
// first of equal values wins, both zeros included) while summing the values into a NanWatch: without NaNs that is
// the first-maximum rule exactly, and a NaN anywhere makes the watch's sum NaN (so can +inf + -inf or an overflow:
// those only cost the second pass). Only then does the exact rule run over the same outputs (V::beats: the first NaN
// wins; three compares and two mask operations per tap, which left the 16-channel 2x2x2 layers at 0.75-0.89x oneDNN's
// primitive, issue 17). bf16 and fp16 compare integer keys, where the exact rule is one compare: one pass. The
// watch is checked once per thread's share of the outputs, so its lane reduction costs nothing per window.
template <class E>
struct NanWatch {
  Vector<E, 16> sum16{};
  Vector<E, 8> sum8{};
  Vector<E, 4> sum4{};
  template <int L>
  void add(Vector<E, L> v) {
    static_assert(L == 16 || L == 8 || L == 4);
    if constexpr (L == 16)
      sum16 += v;
    else if constexpr (L == 8)
      sum8 += v;
    else
      sum4 += v;
  }
  bool nan() const { return sum_is_nan<E, 16>(sum16) || sum_is_nan<E, 8>(sum8) || sum_is_nan<E, 4>(sum4); }
};

template <class V, bool Plain, int Chains, class Watch>
struct BlockPass {
  Watch* watch;                    // the plain pass's (a NanWatch of V's element type)
  typename V::K sum[Chains] = {};  // one per chain of compares, so the additions do not chain them together
  template <class Key>
  auto take(int chain, Key best, Key value) {
    if constexpr (Plain) {
      sum[chain] += value;
      return value > best;
    } else {
      return V::beats(best, value);
    }
  }
  void finish() {
    if constexpr (Plain) {
      typename V::K total = sum[0];
      for (int chain = 1; chain < Chains; ++chain) total += sum[chain];
      watch->template add<V::lanes>(total);
    }
  }
};

// What the W chains of window_block_channels_last are: chain w is the window at origin + w * position_step, channels
// [c0 + w * channel_step, + L), output at out + w * output_step. Neighbouring windows of an output row ({kernel
// width, 0, channels}) or neighbouring channel blocks of one window ({0, L, L}).
struct Chains {
  std::int64_t position_step, channel_step, output_step;
};

// W blocks of L channels of channels-last windows (independent chains of compares that the CPU overlaps): the taps
// in kernel order, a compare and selects per tap. Outputs at out + w * output_step, index + w * output_step.
template <class T, int L, int W, bool Plain, class Watch>
[[gnu::always_inline]] inline void window_block_channels_last(const typename MaxOrder<T>::Storage* in,
                                                              std::int64_t channels, std::int64_t c0,
                                                              std::int64_t origin, Chains chains,
                                                              const std::int32_t* offsets, std::int64_t tap_count,
                                                              typename MaxOrder<T>::Storage* out, std::int32_t* index,
                                                              Watch* watch) {
  using V = VectorMaxOrder<T, L>;
  using I = Vector<std::int32_t, L>;
  BlockPass<V, Plain, W, Watch> rule{watch};
  typename V::B best[W];  // (f32 and f64: the key's bits)
  typename V::K key[W];
  I winner[W];  // the winning tap's offset; the window's origin is added at the end
  const typename MaxOrder<T>::Storage* window[W];
  for (int w = 0; w < W; ++w) {
    window[w] = in + (origin + w * chains.position_step) * channels + c0 + w * chains.channel_step;
    best[w] = V::load_bits(window[w] + offsets[0] * channels);
    key[w] = V::key(best[w]);
    rule.take(w, key[w], key[w]);  // (the plain rule's sum)
    winner[w] = I{} + offsets[0];
  }
  for (std::int64_t t = 1; t < tap_count; ++t) {
    const std::int64_t at = offsets[t] * channels;
    const I tap = I{} + offsets[t];  // shared by the W windows
    for (int w = 0; w < W; ++w) {
      const typename V::B value = V::load_bits(window[w] + at);
      const typename V::K value_key = V::key(value);
      const auto take = rule.take(w, key[w], value_key);
      key[w] = take ? value_key : key[w];
      if constexpr (!V::floating) best[w] = take ? value : best[w];
      winner[w] = __builtin_convertvector(take, I) ? tap : winner[w];
    }
  }
  rule.finish();
  for (int w = 0; w < W; ++w) {
    const typename V::B stored = V::stored(V::floating ? reinterpret_cast<typename V::B>(key[w]) : best[w]);
    const I position = winner[w] + static_cast<std::int32_t>(origin + w * chains.position_step);
    std::memcpy(out + w * chains.output_step, &stored, sizeof stored);
    std::memcpy(index + w * chains.output_step, &position, sizeof position);
  }
}

// L channels-first windows (2 wide) of output columns [ow0, ow0 + L) of one output row, or (high_input,
// high_output: the next output row's shifts) the first L / 2 of two output rows: per window row, the even and odd
// input columns de-interleaved (two vector loads, two shuffles) and compared, the row's winner merged after the
// earlier rows'.
template <class T, int L>
void row_block_channels_first(const typename MaxOrder<T>::Storage* in, const std::int64_t* row_starts,
                              std::int64_t window_rows, std::int64_t ow0, typename MaxOrder<T>::Storage* out,
                              std::int32_t* index, std::int64_t high_input = L, std::int64_t high_output = L / 2) {
  using V = VectorMaxOrder<T, L>;
  using I = Vector<std::int32_t, L>;
  using B = typename V::B;
  using M = Vector<std::make_unsigned_t<typename V::Key>, L>;  // shuffle indices
  M even_columns, odd_columns;
  I lanes;
  for (int i = 0; i < L; ++i) {
    even_columns[i] = static_cast<typename V::Bits>(2 * i);
    odd_columns[i] = static_cast<typename V::Bits>(2 * i + 1);
    lanes[i] = static_cast<std::int32_t>(i < L / 2 ? 2 * i : high_input + 2 * (i - L / 2));
  }
  typename V::K key{};
  B best{};
  I winner{};
  for (std::int64_t k = 0; k < window_rows; ++k) {
    const std::int64_t start = row_starts[k] + 2 * ow0;
    const B low = V::load_bits(in + start), high = V::load_bits(in + start + high_input);
    const B even = __builtin_shuffle(low, high, even_columns), odd = __builtin_shuffle(low, high, odd_columns);
    const typename V::K even_key = V::key(even), odd_key = V::key(odd);
    const auto odd_wins = V::beats(even_key, odd_key);
    const typename V::K row_key = odd_wins ? odd_key : even_key;
    const B row_best = odd_wins ? odd : even;
    const I row_winner = lanes + static_cast<std::int32_t>(start) + (__builtin_convertvector(odd_wins, I) & 1);
    const auto take = k == 0 ? ~decltype(odd_wins){} : V::beats(key, row_key);  // the first row sets the maximum
    key = take ? row_key : key;
    best = take ? row_best : best;
    winner = __builtin_convertvector(take, I) ? row_winner : winner;
  }
  std::memcpy(out, &best, sizeof best / 2);
  std::memcpy(out + high_output, reinterpret_cast<const char*>(&best) + sizeof best / 2, sizeof best / 2);
  std::memcpy(index, &winner, sizeof winner / 2);
  std::memcpy(index + high_output, reinterpret_cast<const char*>(&winner) + sizeof winner / 2, sizeof winner / 2);
}

// Channels-last, L / 2 channels (4 or 8) and 2-wide windows: windows ow .. ow + 3 two to a vector. Per window row, a
// load per window covers both taps of the row (kw = 0 then 1, L / 2 channels each); two shuffles make the kw = 0 and
// kw = 1 vectors of two windows, merged in kernel order. row_offsets: offsets[2 k], the window rows' first taps.
template <class T, int L, bool Plain, class Watch>
[[gnu::always_inline]] inline void window_pairs_channels_last(const typename MaxOrder<T>::Storage* in,
                                                              std::int64_t origin, std::int64_t step,
                                                              const std::int32_t* offsets, std::int64_t window_rows,
                                                              typename MaxOrder<T>::Storage* out, std::int32_t* index,
                                                              Watch* watch) {
  using V = VectorMaxOrder<T, L>;
  using I = Vector<std::int32_t, L>;
  using B = typename V::B;
  using M = Vector<std::make_unsigned_t<typename V::Key>, L>;
  constexpr int half = L / 2;  // the channels
  M first_taps, second_taps;
  I second_window;
  for (int i = 0; i < L; ++i) {
    first_taps[i] = static_cast<typename V::Bits>(i < half ? i : L + i - half);
    second_taps[i] = static_cast<typename V::Bits>(i < half ? half + i : L + i);
    second_window[i] = i < half ? 0 : static_cast<std::int32_t>(step);
  }
  BlockPass<V, Plain, 2, Watch> rule{watch};
  typename V::K key[2] = {};
  B best[2] = {};  // (f32 and f64: the key's bits)
  I winner[2] = {};
  for (std::int64_t k = 0; k < window_rows; ++k)
    for (int pair = 0; pair < 2; ++pair) {
      const std::int64_t position = origin + 2 * pair * step + offsets[2 * k];
      const B low = V::load_bits(in + position * half), high = V::load_bits(in + (position + step) * half);
      const I first_position = second_window + static_cast<std::int32_t>(position);
      for (int kw = 0; kw < 2; ++kw) {
        const B value = __builtin_shuffle(low, high, kw == 0 ? first_taps : second_taps);
        const typename V::K value_key = V::key(value);
        const I value_position = first_position + kw;
        if (k == 0 && kw == 0) {
          rule.take(pair, value_key, value_key);  // (the plain rule's sum)
          key[pair] = value_key;
          best[pair] = value;
          winner[pair] = value_position;
          continue;
        }
        const auto take = rule.take(pair, key[pair], value_key);
        key[pair] = take ? value_key : key[pair];
        if constexpr (!V::floating) best[pair] = take ? value : best[pair];
        winner[pair] = __builtin_convertvector(take, I) ? value_position : winner[pair];
      }
    }
  rule.finish();
  for (int pair = 0; pair < 2; ++pair) {
    const B stored = V::stored(V::floating ? reinterpret_cast<B>(key[pair]) : best[pair]);
    std::memcpy(out + pair * L, &stored, sizeof stored);
    std::memcpy(index + pair * L, &winner[pair], sizeof winner[pair]);
  }
}

// Channels-last forward of windows that tile the input: per window and block of channels, the taps in kernel order,
// one compare and select per value over the contiguous channels.
template <class T>
void forward_tiling_channels_last(const SpatialGeometry& g, const TensorView& x, const TensorView& y,
                                  std::int32_t* argmax) {
  using Order = MaxOrder<T>;
  using S = typename Order::Storage;
  const Box b = box_of(g);
  const std::vector<std::int32_t> taps = tiling_taps(b);
  const std::int32_t* offsets = taps.data();
  const auto tap_count = static_cast<std::int64_t>(taps.size());
  const std::int64_t channels = g.in_channels, in_size = g.input_size();
  const std::int64_t rows = x.rows * b.out[0] * b.out[1];
  const S* input = storage_of<T>(x);
  S* output = mutable_storage_of<T>(y);
  // 4 or 8 channels and 2-wide windows: two windows to a vector (where that vector fits one register).
  constexpr int lanes = forward_lanes<T>;
  const std::int64_t window_rows = b.kernel[0] * b.kernel[1];
  const bool pairs = b.kernel[2] == 2 && ((channels == 8 && 16 * lane_bytes<T> <= vector_register_bytes) ||
                                          (channels == 4 && 8 * lane_bytes<T> <= vector_register_bytes));
  using Watch = NanWatch<std::conditional_t<VectorMaxOrder<T, 4>::floating, T, float>>;
  // The rows [begin, end) by the plain rule (watch) or the exact one (no watch).
  auto rows_pass = [&]<bool Plain>(std::int64_t begin, std::int64_t end, Watch* watch) {
    OutputRow r = output_row(b, begin);
    for (std::int64_t row = begin; row < end; ++row) {
      const S* in = input + r.n * channels * in_size;
      // Up to 16 channels: windows 4 at a time (independent chains of compares that the CPU overlaps; more channels
      // have blocks enough), the last ones one at a time.
      for (std::int64_t ow0 = 0; ow0 < b.out[2];) {
        if (pairs && ow0 + 4 <= b.out[2]) {
          const std::int64_t o = row * b.out[2] + ow0;
          const std::int64_t origin = window_origin(b, r.d, r.h, ow0);
          if (channels == 8)
            window_pairs_channels_last<T, 16, Plain>(in, origin, 2, offsets, window_rows, output + o * 8,
                                                     argmax + o * 8, watch);
          else
            window_pairs_channels_last<T, 8, Plain>(in, origin, 2, offsets, window_rows, output + o * 4, argmax + o * 4,
                                                    watch);
          ow0 += 4;
          continue;
        }
        const bool four = channels <= lanes && ow0 + 4 <= b.out[2];
        const std::int64_t group = four ? 4 : 1;
        // More channels: a window's channel blocks 4 (then 2) at a time, the rest one at a time.
        std::int64_t wide = 0;
        if (!four) {
          const std::int64_t o = row * b.out[2] + ow0, origin = window_origin(b, r.d, r.h, ow0);
          for (; wide + 4 * lanes <= channels; wide += 4 * lanes)
            window_block_channels_last<T, lanes, 4, Plain>(in, channels, wide, origin, {0, lanes, lanes}, offsets,
                                                           tap_count, output + o * channels + wide,
                                                           argmax + o * channels + wide, watch);
          if (wide + 2 * lanes <= channels) {
            window_block_channels_last<T, lanes, 2, Plain>(in, channels, wide, origin, {0, lanes, lanes}, offsets,
                                                           tap_count, output + o * channels + wide,
                                                           argmax + o * channels + wide, watch);
            wide += 2 * lanes;
          }
        }
        for_each_block(channels - wide, [&](std::int64_t start, auto size) {
          const std::int64_t c0 = wide + start;
          for (std::int64_t ow = ow0; ow < ow0 + group; ++ow) {
            const std::int64_t origin = window_origin(b, r.d, r.h, ow), o = row * b.out[2] + ow;
            S* out = output + o * channels + c0;
            std::int32_t* index = argmax + o * channels + c0;
            if constexpr (!std::is_same_v<decltype(size), std::int64_t>) {
              constexpr int lanes = static_cast<int>(decltype(size)::value);
              const Chains windows{b.kernel[2], 0, channels};
              if (four)
                window_block_channels_last<T, lanes, 4, Plain>(in, channels, c0, origin, windows, offsets, tap_count,
                                                               out, index, watch);
              else
                window_block_channels_last<T, lanes, 1, Plain>(in, channels, c0, origin, windows, offsets, tap_count,
                                                               out, index, watch);
              break;  // the group is done
            } else {
              BlockMaximum<T> m;
              const S* __restrict first = in + (origin + offsets[0]) * channels + c0;
#pragma omp simd
              for (std::int64_t c = 0; c < size; ++c) m.set(c, first[c], origin + offsets[0]);
              for (std::int64_t t = 1; t < tap_count; ++t) {
                const std::int64_t position = origin + offsets[t];
                const S* __restrict values = in + position * channels + c0;
#pragma omp simd
                for (std::int64_t c = 0; c < size; ++c) m.merge(c, Order::key(values[c]), values[c], position);
              }
#pragma omp simd
              for (std::int64_t c = 0; c < size; ++c) {
                out[c] = Order::stored(m.best[c]);
                index[c] = m.index[c];
              }
            }
          }
        });
        ow0 += group;
      }
      // The next row: no division per row.
      if (++r.h == b.out[1]) {
        r.h = 0;
        if (++r.d == b.out[0]) {
          r.d = 0;
          ++r.n;
        }
      }
    }
  };
#pragma omp parallel
  {
    const std::int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const std::int64_t begin = rows * thread / threads, end = rows * (thread + 1) / threads;
    bool exact = true;
    if constexpr (VectorMaxOrder<T, 4>::floating) {
      Watch watch;
      rows_pass.template operator()<true>(begin, end, &watch);
      exact = watch.nan();
    }
    if (exact) rows_pass.template operator()<false>(begin, end, nullptr);
  }
}

// Channels-last backward of windows that tile the input: each covered dx element written once, the gradient where
// it is its window's first maximum, +0 elsewhere.
template <class T>
void backward_tiling_channels_last(const SpatialGeometry& g, const TensorView& dy, const std::int32_t* argmax,
                                   const TensorView& dx) {
  using Order = MaxOrder<T>;
  using S = typename Order::Storage;
  const Box b = box_of(g);
  const std::vector<std::int32_t> taps = tiling_taps(b);
  const std::int64_t channels = g.in_channels, in_size = g.input_size();
  const std::int64_t rows = dx.rows * b.out[0] * b.out[1];
  const S* gradients = storage_of<T>(dy);
  S* input_gradients = mutable_storage_of<T>(dx);
#pragma omp parallel for schedule(static)
  for (std::int64_t row = 0; row < rows; ++row) {
    const OutputRow r = output_row(b, row);
    S* out = input_gradients + r.n * channels * in_size;
    for (std::int64_t ow = 0; ow < b.out[2]; ++ow) {
      const std::int64_t origin = window_origin(b, r.d, r.h, ow), o = row * b.out[2] + ow;
      for_each_block(channels, [&](std::int64_t c0, auto size) {
        S gradient[block];
        const S* __restrict upstream = gradients + o * channels + c0;
        const std::int32_t* __restrict index = argmax + o * channels + c0;
#pragma omp simd
        for (std::int64_t c = 0; c < size; ++c) gradient[c] = Order::gradient(upstream[c]);
        for (const std::int32_t offset : taps) {
          const auto position = static_cast<std::int32_t>(origin + offset);
          S* __restrict target = out + position * channels + c0;
#pragma omp simd
          for (std::int64_t c = 0; c < size; ++c) target[c] = index[c] == position ? gradient[c] : S{0};
        }
      });
    }
  }
}

// Channels-first forward of windows that tile the input: per output row and block of its outputs, the window rows
// in kernel order; along a row, 2-wide windows compare the even and odd input columns and merge the winner.
template <class T>
void forward_tiling_channels_first(const SpatialGeometry& g, const TensorView& x, const TensorView& y,
                                   std::int32_t* argmax) {
  using Order = MaxOrder<T>;
  using S = typename Order::Storage;
  const Box b = box_of(g);
  const std::int64_t planes = x.rows * g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  const std::int64_t kernel_width = b.kernel[2], window_rows = b.kernel[0] * b.kernel[1];
  const S* input = storage_of<T>(x);
  S* output = mutable_storage_of<T>(y);
  // The window rows' first positions from the window's (kernel[0] * kernel[1] <= 64 for the vector loops).
  const bool vectors = kernel_width == 2 && window_rows <= 64;
  std::int64_t row_offsets[64] = {};
  for (std::int64_t k = 0; vectors && k < window_rows; ++k)
    row_offsets[k] = (k / b.kernel[1] * b.in[1] + k % b.kernel[1]) * b.in[2];
#pragma omp parallel for schedule(static)
  for (std::int64_t plane = 0; plane < planes; ++plane)
    for (std::int64_t od = 0; od < b.out[0]; ++od)
      for (std::int64_t oh = 0; oh < b.out[1]; ++oh) {
        const S* in = input + plane * in_size;
        std::int64_t row_starts[64];
        const std::int64_t origin = window_origin(b, od, oh, 0);
        for (std::int64_t k = 0; vectors && k < window_rows; ++k) row_starts[k] = origin + row_offsets[k];
        // rows oh, oh + 1 in one vector (one register: see vector_register_bytes)
        if (vectors && (b.out[2] == 4 || b.out[2] == 8) && 2 * b.out[2] * lane_bytes<T> <= vector_register_bytes &&
            oh + 1 < b.out[1]) {
          const std::int64_t o = plane * out_size + (od * b.out[1] + oh) * b.out[2];
          const std::int64_t next_row = b.kernel[1] * b.in[2];
          if (b.out[2] == 4)
            row_block_channels_first<T, 8>(in, row_starts, window_rows, 0, output + o, argmax + o, next_row, 4);
          else
            row_block_channels_first<T, 16>(in, row_starts, window_rows, 0, output + o, argmax + o, next_row, 8);
          ++oh;
          continue;
        }
        for_each_block(b.out[2], [&](std::int64_t ow0, auto size) {
          if constexpr (!std::is_same_v<decltype(size), std::int64_t>) {
            if (vectors) {  // in blocks of one register's lanes (at least 4)
              constexpr int outputs = static_cast<int>(decltype(size)::value);
              constexpr int width = std::min<int>(outputs, forward_lanes<T>);
              const std::int64_t o = plane * out_size + (od * b.out[1] + oh) * b.out[2] + ow0;
              for (int part = 0; part < outputs; part += width)
                row_block_channels_first<T, width>(in, row_starts, window_rows, ow0 + part, output + o + part,
                                                   argmax + o + part);
              return;
            }
          }
          BlockMaximum<T> m;
          for (std::int64_t k = 0; k < window_rows; ++k) {
            const std::int64_t kd = k / b.kernel[1], kh = k % b.kernel[1];
            const std::int64_t start =
                ((od * b.kernel[0] + kd) * b.in[1] + oh * b.kernel[1] + kh) * b.in[2] + ow0 * kernel_width;
            const S* __restrict values = in + start;
            BlockMaximum<T> r;  // this row's first maximum of each window
            if (kernel_width == 2) {
#pragma omp simd
              for (std::int64_t i = 0; i < size; ++i) {
                r.set(i, values[2 * i], start + 2 * i);
                r.merge(i, Order::key(values[2 * i + 1]), values[2 * i + 1], start + 2 * i + 1);
              }
            } else {
#pragma omp simd
              for (std::int64_t i = 0; i < size; ++i) {
                r.set(i, values[i * kernel_width], start + i * kernel_width);
                for (std::int64_t kw = 1; kw < kernel_width; ++kw)
                  r.merge(i, Order::key(values[i * kernel_width + kw]), values[i * kernel_width + kw],
                          start + i * kernel_width + kw);
              }
            }
            if (k == 0) {  // the first row sets the maximum, later ones merge into it
#pragma omp simd
              for (std::int64_t i = 0; i < size; ++i) m.set(i, r.best[i], r.index[i]);
            } else {
#pragma omp simd
              for (std::int64_t i = 0; i < size; ++i) m.merge(i, r.key[i], r.best[i], r.index[i]);
            }
          }
          const std::int64_t o = plane * out_size + (od * b.out[1] + oh) * b.out[2] + ow0;
#pragma omp simd
          for (std::int64_t i = 0; i < size; ++i) {
            output[o + i] = m.best[i];
            argmax[o + i] = m.index[i];
          }
        });
      }
}

void forward_channels_last(const SpatialGeometry& g, const TensorView& x, const TensorView& y, std::int32_t* argmax) {
  const Box b = box_of(g);
  const std::int64_t channels = g.in_channels, in_size = g.input_size();
  const std::int64_t rows = x.rows * b.out[0] * b.out[1];
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
#pragma omp parallel
    {
      std::vector<C> best_value(static_cast<std::size_t>(channels));
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < rows; ++row) {
        const OutputRow r = output_row(b, row);
        const T* in = x.as<T>() + r.n * channels * in_size;
        const std::int64_t first = row * b.out[2];  // the row's first output in the batch
        for (std::int64_t ow = 0; ow < b.out[2]; ++ow) {
          std::int32_t* index = argmax + (first + ow) * channels;
          window_argmax_channels_last(b, channels, in, r.d, r.h, ow, index, best_value.data());
          T* out = y.as<T>() + (first + ow) * channels;
          // The winner as it is (no round trip through double: see the file's head), -inf for a window in the
          // padding.
          for (std::int64_t c = 0; c < channels; ++c)
            out[c] = index[c] >= 0 ? store<T>(best_value[static_cast<std::size_t>(c)])
                                   : store<T>(-std::numeric_limits<C>::infinity());
        }
      }
    }
  });
}

// Overlapping windows: one thread per sample adds every output's gradient at its window's first maximum in output
// order (the order of pooling_backward), into dx itself when the storage is the compute type, else into a
// compute-type copy rounded once at the end.
void backward_scatter_channels_last(const SpatialGeometry& g, const TensorView& dy, const std::int32_t* argmax,
                                    const TensorView& dx) {
  const std::int64_t channels = g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(dx.dtype, [&]<class T>() {
    using C = compute_t<T>;
    constexpr bool in_place = std::is_same_v<T, C>;
#pragma omp parallel
    {
      std::vector<C> copy(in_place ? 0 : static_cast<std::size_t>(channels * in_size));
#pragma omp for schedule(static)
      for (std::int64_t n = 0; n < dx.rows; ++n) {
        C* sums = nullptr;
        if constexpr (in_place)
          sums = dx.as<T>() + n * channels * in_size;
        else
          sums = copy.data();
        std::fill_n(sums, channels * in_size, C(0));
        for (std::int64_t o = n * out_size; o < (n + 1) * out_size; ++o) {
          const T* upstream = dy.as<T>() + o * channels;
          const std::int32_t* index = argmax + o * channels;
          for (std::int64_t c = 0; c < channels; ++c)
            if (index[c] >= 0) sums[index[c] * channels + c] += load(upstream[c]);
        }
        if constexpr (!in_place) {
          T* out = dx.as<T>() + n * channels * in_size;
          for (std::int64_t i = 0; i < channels * in_size; ++i) out[i] = store<T>(sums[i]);
        }
      }
    }
  });
}

// Channels-first: one thread per (sample, channel) plane, its outputs in memory order.
void forward_channels_first(const SpatialGeometry& g, const TensorView& x, const TensorView& y, std::int32_t* argmax) {
  const Box b = box_of(g);
  const std::int64_t planes = x.rows * g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(x.dtype, [&]<class T>() {
#pragma omp parallel for schedule(static)
    for (std::int64_t plane = 0; plane < planes; ++plane) {
      const T* in = x.as<T>() + plane * in_size;
      T* out = y.as<T>() + plane * out_size;
      std::int32_t* index = argmax + plane * out_size;
      for_each_output(b, [&](std::int64_t o, std::int64_t od, std::int64_t oh, std::int64_t ow) {
        const std::int64_t best = window_argmax(b, in, od, oh, ow);
        index[o] = static_cast<std::int32_t>(best);
        out[o] = best >= 0 ? in[best] : store_from_double<T>(-std::numeric_limits<double>::infinity());
      });
    }
  });
}

// Channels-first backward: disjoint windows write 0 + the gradient at each first maximum into a zeroed plane;
// overlapping ones add in output order into a compute-type plane rounded once (as pooling_backward).
void backward_channels_first(const SpatialGeometry& g, const TensorView& dy, const std::int32_t* argmax,
                             const TensorView& dx) {
  const Box b = box_of(g);
  const bool disjoint = windows_tile_the_input(b);
  const std::int64_t planes = dx.rows * g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(dx.dtype, [&]<class T>() {
    using C = compute_t<T>;
#pragma omp parallel
    {
      std::vector<C> sums(disjoint ? 0 : static_cast<std::size_t>(in_size));
#pragma omp for schedule(static)
      for (std::int64_t plane = 0; plane < planes; ++plane) {
        const T* gradient = dy.as<T>() + plane * out_size;
        const std::int32_t* index = argmax + plane * out_size;
        T* out = dx.as<T>() + plane * in_size;
        if (disjoint) {
          std::memset(out, 0, static_cast<std::size_t>(in_size) * sizeof(T));  // all-zero bits: +0 in every dtype
          for (std::int64_t o = 0; o < out_size; ++o) out[index[o]] = store<T>(C(0) + load(gradient[o]));
          continue;
        }
        std::fill(sums.begin(), sums.end(), C(0));
        for (std::int64_t o = 0; o < out_size; ++o)
          if (index[o] >= 0) sums[static_cast<std::size_t>(index[o])] += load(gradient[o]);
        for (std::int64_t i = 0; i < in_size; ++i) out[i] = store<T>(sums[static_cast<std::size_t>(i)]);
      }
    }
  });
}

}  // namespace

void max_pooling_forward(const SpatialGeometry& g, const TensorView& x, const TensorView& y, std::int32_t* argmax) {
  if (argmax == nullptr) {
    pooling_forward(PoolingKind::max, g, x, y);
    return;
  }
  check_pooling(g, x, y, "max_pooling_forward");
  HPCTRAIN_ASSERT(g.input_size() < std::numeric_limits<std::int32_t>::max(),
                  "max_pooling_forward: " << g.input_size() << " positions per plane (int32 argmax)");
  const bool last = g.layout == SpatialLayout::channels_last;
  if (windows_tile_the_input(box_of(g)))
    dispatch_dtype(x.dtype, [&]<class T>() {
      if (last)
        forward_tiling_channels_last<T>(g, x, y, argmax);
      else
        forward_tiling_channels_first<T>(g, x, y, argmax);
    });
  else if (last)
    forward_channels_last(g, x, y, argmax);
  else
    forward_channels_first(g, x, y, argmax);
}

void max_pooling_backward(const SpatialGeometry& g, const TensorView& x, const TensorView& dy,
                          const std::int32_t* argmax, const TensorView& dx) {
  if (argmax == nullptr) {
    pooling_backward(PoolingKind::max, g, x, dy, dx);
    return;
  }
  check_pooling(g, x, dy, "max_pooling_backward");
  HPCTRAIN_ASSERT(dx.dtype == x.dtype && dx.rows == x.rows && dx.cols == x.cols, "max_pooling_backward: dx shape");
  const Box b = box_of(g);
  if (g.layout == SpatialLayout::channels_first) {
    backward_channels_first(g, dy, argmax, dx);
  } else if (windows_tile_the_input(b)) {
    bool covered = true;  // input positions past the last whole window get no gradient: zero them first
    for (std::size_t a = 0; a < 3; ++a) covered = covered && b.out[a] * b.stride[a] == b.in[a];
    if (!covered) std::memset(dx.data, 0, dx.bytes());
    dispatch_dtype(dx.dtype, [&]<class T>() { backward_tiling_channels_last<T>(g, dy, argmax, dx); });
  } else {
    backward_scatter_channels_last(g, dy, argmax, dx);
  }
}

}  // namespace hpctrain::cpu
