// How the CUDA backend's reductions are cut into blocks, as pure functions of the shapes (host-only, tested on the CPU
// in tests/unit/cuda_host_logic_test.cpp). A plan depends on the shape alone, never on the device, so the summation
// order, and with it every result bit, is the same on any GPU and in every run.
//
// - Column sums (bias gradients, layernorm parameter gradients, channels-last convolution bias gradients): a 2-D grid
//   of (32-column tiles) x (row chunks); each block writes one partial per column and chunk, and a second pass adds
//   each column's partials in chunk order. One block per column tile alone leaves most of a GPU idle on a 70,000-row
//   batch of a narrow layer.
// - Segment sums (layernorm and groupnorm statistics and data gradients, per-(sample, channel) convolution bias and
//   groupnorm parameter gradients): a segment (a row, a (sample, group) block, a (sample, channel) plane) is cut into
//   chunks, one block each, so a few long segments (a CosmoFlow groupnorm: 4 samples x 8 groups of 2 million values)
//   still fill the GPU; the consumer adds a segment's partials in chunk order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace hpctrain::cuda {

struct ColumnSumPlan {
  std::int64_t column_tiles = 1;  // blocks along the columns (32 columns each)
  std::int64_t row_chunks = 1;    // blocks along the rows; 1: no second pass, the block writes the result
  std::int64_t rows_per_chunk = 0;
  [[nodiscard]] bool two_pass() const { return row_chunks > 1; }
};

inline constexpr std::int64_t column_tile = 32;
inline constexpr std::int64_t min_rows_per_chunk = 128;  // 8 row slices x 16 rows per thread
inline constexpr std::int64_t max_row_chunks = 1024;

inline ColumnSumPlan plan_column_sums(std::int64_t rows, std::int64_t cols) {
  ColumnSumPlan plan;
  plan.column_tiles = std::max<std::int64_t>((cols + column_tile - 1) / column_tile, 1);
  const std::int64_t per_chunk = std::max(min_rows_per_chunk, (rows + max_row_chunks - 1) / max_row_chunks);
  plan.rows_per_chunk = (per_chunk + 7) / 8 * 8;
  plan.row_chunks = std::max<std::int64_t>((rows + plan.rows_per_chunk - 1) / plan.rows_per_chunk, 1);
  return plan;
}

struct SegmentPlan {
  std::int64_t chunks = 1;        // blocks per segment
  std::int64_t chunk_length = 0;  // elements per block (the last chunk of a segment may be shorter)
};

inline constexpr std::int64_t target_blocks = 2048;     // enough to fill an H200 (132 SMs) several times over
inline constexpr std::int64_t min_chunk_length = 1024;  // 4 elements per thread of a 256-thread block
inline constexpr std::int64_t max_segment_chunks = 1024;

inline SegmentPlan plan_segments(std::int64_t segments, std::int64_t length) {
  SegmentPlan plan;
  segments = std::max<std::int64_t>(segments, 1);
  length = std::max<std::int64_t>(length, 1);
  const std::int64_t wanted = (target_blocks + segments - 1) / segments;
  const std::int64_t most = std::max<std::int64_t>(length / min_chunk_length, 1);  // chunks of >= min_chunk_length
  const std::int64_t chunks = std::clamp<std::int64_t>(wanted, 1, std::min(most, max_segment_chunks));
  plan.chunk_length = (length + chunks - 1) / chunks;
  plan.chunk_length = (plan.chunk_length + 3) / 4 * 4;
  plan.chunks = (length + plan.chunk_length - 1) / plan.chunk_length;
  return plan;
}

// Whether every index of `count` elements fits the 32-bit index arithmetic (FastDivisor's numerators are < 2^31).
inline bool fits_32bit_indexing(std::int64_t count) { return count >= 0 && count < (std::int64_t{1} << 31); }

// Layernorm rows: a warp per row while there are enough rows to fill the GPU, else the segmented path.
inline bool layernorm_uses_segments(std::int64_t rows, std::int64_t cols) {
  return plan_segments(rows, cols).chunks > 1;
}

}  // namespace hpctrain::cuda
