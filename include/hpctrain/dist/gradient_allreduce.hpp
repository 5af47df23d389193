// Bucketed, overlapped gradient all-reduce over MPI (CPU backend).
//
// Buckets are runs of whole layers' gradients of about bucket_bytes, cut from the end of the flat gradient buffer
// (backward produces the last layers' gradients first). As soon as backward has finished every layer of a bucket, an
// MPI_Iallreduce (sum, in place) starts on it, so communication overlaps the rest of backward; finish() waits for all.
// The loss gradient is already divided by the global batch size, so the sum is the average gradient.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace hpctrain {

class GradientAllreduce {
 public:
  // layer_begins: element offsets where each layer's gradients start (ascending, any number of layers).
  GradientAllreduce(MPI_Comm communicator, float* gradients, std::int64_t count,
                    const std::vector<std::int64_t>& layer_begins, std::int64_t bucket_bytes);
  ~GradientAllreduce();
  GradientAllreduce(const GradientAllreduce&) = delete;
  GradientAllreduce& operator=(const GradientAllreduce&) = delete;

  void begin_step();
  // Every gradient at [begin, count) is final: start the buckets that are now complete.
  void ready_from(std::int64_t begin);
  // Start what is left and wait for all buckets.
  void finish();

  [[nodiscard]] std::size_t bucket_count() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::int64_t begin, end;
  };
  MPI_Comm communicator_;
  int ranks_ = 1;
  float* gradients_;
  std::int64_t count_;
  std::vector<Bucket> buckets_;  // from the end of the buffer to its start
  std::vector<MPI_Request> requests_;
  std::size_t started_ = 0;
};

}  // namespace hpctrain
