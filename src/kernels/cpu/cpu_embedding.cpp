// Embedding lookup on the CPU: the forward gathers table rows (master dtype) into activation rows; the backward sums
// the gradient rows of each id without floating-point races: the rows are sorted by id (a stable counting sort), then
// each thread owns whole ids and adds their rows in row order, so the result is the same for any thread count.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "cpu_sequence.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {
namespace {

// The ids are this rank's batch: only it sees a bad one, so only it reports (as the softmax cross-entropy's labels).
void check_ids(const std::int32_t* ids, std::int64_t rows, std::int64_t vocabulary) {
  for (std::int64_t r = 0; r < rows; ++r)
    HPCTRAIN_VERIFY(
        ids[r] >= 0 && ids[r] < vocabulary, InputError,
        "token id " << ids[r] << " of batch row " << r << " is outside the vocabulary [0, " << vocabulary << ")",
        "token ids are checked when the data is opened, so the data file changed while hpctrain ran: "
        "restore it and run again (training: --resume auto)",
        ErrorScope::this_rank);
}

}  // namespace

void CpuEmbedding::forward(const std::int32_t* ids, const void* table, std::int64_t vocabulary, const TensorView& y,
                           const void* positions, std::int64_t sequence) {
  check_ids(ids, y.rows, vocabulary);
  HPCTRAIN_ASSERT(positions == nullptr || sequence > 0, "embedding: positions without a sequence length");
  const std::int64_t cols = y.cols;
  dispatch_dtype(y.dtype, [&]<class T>() {
    using Master = compute_t<T>;                                  // f32, or f64 for f64 activations
    const Master* rows = static_cast<const Master*>(table);       // (vocabulary, cols)
    const Master* added = static_cast<const Master*>(positions);  // (sequence, cols) or null
    T* out = static_cast<T*>(y.data);                             // (rows, cols)
#pragma omp parallel for schedule(static) if (y.size() > 16384)
    for (std::int64_t r = 0; r < y.rows; ++r) {
      const Master* source = rows + static_cast<std::int64_t>(ids[r]) * cols;
      if (added == nullptr) {
        for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = convert_value<T>(source[c]);
      } else {
        const Master* position = added + (r % sequence) * cols;
        for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = convert_value<T>(source[c] + position[c]);
      }
    }
  });
}

void CpuEmbedding::backward(const std::int32_t* ids, const TensorView& dy, std::int64_t vocabulary, void* dtable,
                            bool accumulate) {
  const std::int64_t rows = dy.rows, cols = dy.cols;
  check_ids(ids, rows, vocabulary);
  // Counting sort: starts[id] .. starts[id + 1] - 1 are id's rows in order_by_id, in increasing row order.
  auto* starts = id_starts_.reserve_elements<std::int64_t>(static_cast<std::size_t>(vocabulary + 1));
  auto* order = rows_by_id_.reserve_elements<std::int64_t>(static_cast<std::size_t>(std::max<std::int64_t>(rows, 1)));
  std::fill_n(starts, vocabulary + 1, std::int64_t{0});
  for (std::int64_t r = 0; r < rows; ++r) ++starts[ids[r] + 1];
  for (std::int64_t id = 0; id < vocabulary; ++id) starts[id + 1] += starts[id];
  for (std::int64_t r = 0; r < rows; ++r) order[starts[ids[r]]++] = r;  // starts[id] now ends id's rows
  for (std::int64_t id = vocabulary; id > 0; --id) starts[id] = starts[id - 1];
  starts[0] = 0;

  dispatch_dtype(dy.dtype, [&]<class T>() {
    using Master = compute_t<T>;
    const T* gradient = static_cast<const T*>(dy.data);  // (rows, cols)
    Master* out = static_cast<Master*>(dtable);          // (vocabulary, cols)
#pragma omp parallel for schedule(static) if (vocabulary * cols > 16384)
    for (std::int64_t id = 0; id < vocabulary; ++id) {
      Master* destination = out + id * cols;
      if (!accumulate) std::fill_n(destination, cols, Master(0));
      for (std::int64_t position = starts[id]; position < starts[id + 1]; ++position) {
        const T* source = gradient + order[position] * cols;
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c) destination[c] += static_cast<Master>(load(source[c]));
      }
    }
  });
}

}  // namespace hpctrain::cpu
