// Bucketed gradient all-reduce with MPI_Iallreduce, the bucket layout shared with the NCCL version, and the NCCL
// version's entry in the CUDA module.
#include "hpctrain/dist/gradient_allreduce.hpp"

#include <algorithm>
#include <string>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda_module.hpp"

namespace hpctrain {

std::vector<GradientBucket> gradient_buckets(std::int64_t count, const std::vector<std::int64_t>& layer_begins,
                                             std::int64_t bucket_bytes) {
  // Walk layer boundaries from the end; close a bucket once it holds at least bucket_bytes.
  const std::int64_t bucket_elements =
      std::max<std::int64_t>(bucket_bytes / static_cast<std::int64_t>(sizeof(float)), 1);
  std::vector<std::int64_t> boundaries(layer_begins.begin(), layer_begins.end());
  boundaries.push_back(0);
  std::sort(boundaries.begin(), boundaries.end());
  boundaries.erase(std::unique(boundaries.begin(), boundaries.end()), boundaries.end());
  std::vector<GradientBucket> buckets;
  std::int64_t end = count;
  for (auto it = boundaries.rbegin(); it != boundaries.rend(); ++it) {
    const std::int64_t begin = *it;
    if (begin >= end) continue;
    if (end - begin >= bucket_elements || begin == 0) {
      buckets.push_back({begin, end});
      end = begin;
    }
  }
  return buckets;
}

GradientAllreduce::GradientAllreduce(MPI_Comm communicator, float* gradients, std::int64_t count,
                                     const std::vector<std::int64_t>& layer_begins, std::int64_t bucket_bytes)
    : communicator_(communicator),
      gradients_(gradients),
      count_(count),
      buckets_(gradient_buckets(count, layer_begins, bucket_bytes)) {
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(communicator, &ranks_));
  requests_.assign(buckets_.size(), MPI_REQUEST_NULL);
}

GradientAllreduce::~GradientAllreduce() {
  // Never leave a request in flight on the way out (an exception during backward).
  for (auto& request : requests_)
    if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
}

void GradientAllreduce::begin_step() { started_ = 0; }

void GradientAllreduce::ready_from(std::int64_t begin) {
  if (ranks_ == 1) return;
  while (started_ < buckets_.size() && buckets_[started_].begin >= begin) {
    const GradientBucket& bucket = buckets_[started_];
    HPCTRAIN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, gradients_ + bucket.begin,
                                      static_cast<int>(bucket.end - bucket.begin), MPI_FLOAT, MPI_SUM, communicator_,
                                      &requests_[started_]));
    ++started_;
  }
  // Give MPI a chance to progress the buckets already in flight while backward continues.
  if (started_ > 0) {
    int done = 0;
    HPCTRAIN_MPI_CHECK(MPI_Testall(static_cast<int>(started_), requests_.data(), &done, MPI_STATUSES_IGNORE));
  }
}

void GradientAllreduce::finish() {
  if (ranks_ == 1) return;
  ready_from(0);
  HPCTRAIN_MPI_CHECK(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
}

StagedGradientAllreduce::StagedGradientAllreduce(MPI_Comm communicator, Backend& backend, float* gradients,
                                                 std::int64_t count)
    : communicator_(communicator), backend_(backend), gradients_(gradients) {
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(communicator, &ranks_));
  if (ranks_ > 1) host_.resize(static_cast<std::size_t>(count));
}

void StagedGradientAllreduce::finish() {
  if (ranks_ == 1 || host_.empty()) return;
  const std::size_t bytes = host_.size() * sizeof(float);
  backend_.copy_to_host(host_.data(), gradients_, bytes);
  constexpr std::size_t chunk = std::size_t{1} << 30;  // MPI counts are int
  for (std::size_t first = 0; first < host_.size(); first += chunk)
    HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, host_.data() + first,
                                     static_cast<int>(std::min(chunk, host_.size() - first)), MPI_FLOAT, MPI_SUM,
                                     communicator_));
  backend_.copy_to_backend(gradients_, host_.data(), bytes);
}

// The NCCL exchange is part of the CUDA module (src/dist/cuda/); the executable reaches it through the module's table.
std::unique_ptr<GradientExchange> make_nccl_gradient_allreduce(MPI_Comm communicator, Backend& backend,
                                                               float* gradients, std::int64_t count,
                                                               const std::vector<std::int64_t>& layer_begins,
                                                               std::int64_t bucket_bytes) {
  std::string why;
  const CudaModuleTable* module = load_cuda_module(&why);
  if (module == nullptr) throw InputError("NCCL gradient all-reduce: " + why, {}, ErrorScope::this_rank);
  return module->make_nccl_gradient_allreduce(communicator, backend, gradients, count, layer_begins, bucket_bytes);
}

}  // namespace hpctrain
