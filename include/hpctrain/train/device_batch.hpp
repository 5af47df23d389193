// The backend side of a batch: the model's input plus the labels/targets and sample ids the loss and dropout read,
// filled from a host batch (or a slice of it: a micro-batch), and the loss computed on the model's output.
#pragma once

#include "hpctrain/data/training_data.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"

namespace hpctrain {

class Model;

class DeviceBatch {
 public:
  DeviceBatch(Backend& backend, const Model& model, TaskKind task, std::int64_t max_rows);

  // Rows [first, first + rows) of a host batch -> the model's input (cast to the activation dtype) and the loss inputs.
  void upload(const HostBatch& batch, std::int64_t first, std::int64_t rows, Model& model);
  // sums += the loss of `output`; with gradient_scale (backend memory) != nullptr the loss gradient (times the scale)
  // is written over output.
  void loss(const TensorView& output, const float* gradient_scale, LossSums* sums) const;

  [[nodiscard]] const std::int64_t* sample_ids() const { return sample_ids_.as<std::int64_t>(); }

 private:
  Backend& backend_;
  TaskKind task_;
  BackendBuffer staging_, labels_, targets_, sample_ids_;
};

}  // namespace hpctrain
