// The backend side of a batch: the model's input and the loss's answers (labels or targets) plus the sample ids dropout
// reads, filled from a host batch (or a slice of it: a micro-batch).
#pragma once

#include <cstdint>
#include <vector>

#include "hpctrain/data/training_data.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"

namespace hpctrain {

class Model;

// Where a host batch lives. loader_ring: in a BatchLoader's ring, allocated at the same address for as long as this
// DeviceBatch lives, so the backend may page-lock it once and upload from it by DMA (CUDA: no host-side copy).
enum class BatchSource : std::uint8_t { transient, loader_ring };

class DeviceBatch {
 public:
  DeviceBatch(Backend& backend, const Model& model, std::int64_t max_rows);
  ~DeviceBatch();
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  // Rows [first, first + rows) of a host batch -> the model's input (cast to the activation dtype), the answers of the
  // model's loss (when the batch has them: predictions need none) and the sample ids. The features go through
  // Backend::upload_cast (CUDA: a copy stream overlapping the step before).
  void upload(const HostBatch& batch, std::int64_t first, std::int64_t rows, Model& model,
              BatchSource source = BatchSource::transient);
  [[nodiscard]] const std::int64_t* sample_ids() const { return sample_ids_.as<std::int64_t>(); }

 private:
  Backend& backend_;
  BackendBuffer sample_ids_;
  std::vector<const void*> seen_;    // loader buffers offered to the backend for pinning
  std::vector<const void*> pinned_;  // those it page-locked (unpinned at destruction)
};

}  // namespace hpctrain
