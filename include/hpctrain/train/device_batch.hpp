// The backend side of a batch: the model's input and the loss's answers (labels or targets) plus the sample ids dropout
// reads, filled from a host batch (or a slice of it: a micro-batch).
#pragma once

#include "hpctrain/data/training_data.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"

namespace hpctrain {

class Model;

class DeviceBatch {
 public:
  DeviceBatch(Backend& backend, const Model& model, std::int64_t max_rows);
  // Rows [first, first + rows) of a host batch -> the model's input (cast to the activation dtype), the answers of the
  // model's loss (when the batch has them: predictions need none) and the sample ids.
  void upload(const HostBatch& batch, std::int64_t first, std::int64_t rows, Model& model);
  [[nodiscard]] const std::int64_t* sample_ids() const { return sample_ids_.as<std::int64_t>(); }

 private:
  Backend& backend_;
  BackendBuffer staging_, sample_ids_;
};

}  // namespace hpctrain
