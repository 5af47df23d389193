// Moving a host batch to the backend.
#include "hpctrain/train/device_batch.hpp"

#include "hpctrain/nn/model.hpp"

namespace hpctrain {

DeviceBatch::DeviceBatch(Backend& backend, const Model& model, std::int64_t max_rows) : backend_(backend) {
  if (model.buffers().activation_dtype != DType::f32)
    staging_ = BackendBuffer(backend, static_cast<std::size_t>(max_rows * model.input_width()) * sizeof(float));
  sample_ids_ = BackendBuffer(backend, static_cast<std::size_t>(max_rows) * sizeof(std::int64_t));
}

void DeviceBatch::upload(const HostBatch& batch, std::int64_t first, std::int64_t rows, Model& model) {
  const std::int64_t features = model.input_width();
  const TensorView input = model.input(rows);
  const float* source = batch.features.data() + first * features;
  const std::size_t feature_bytes = static_cast<std::size_t>(rows * features) * sizeof(float);
  if (input.dtype == DType::f32) {
    backend_.copy_to_backend(input.data, source, feature_bytes);
  } else {
    backend_.copy_to_backend(staging_.data, source, feature_bytes);
    backend_.cast({staging_.data, DType::f32, rows, features}, input);
  }
  const Loss& loss = model.loss();
  if (loss.kind() == LossKind::cross_entropy && !batch.labels.empty()) {
    backend_.copy_to_backend(loss.answers(), batch.labels.data() + first, loss.answer_bytes(rows));
  } else if (loss.kind() == LossKind::mse && !batch.targets.empty()) {
    backend_.copy_to_backend(loss.answers(), batch.targets.data() + first * model.output_width(),
                             loss.answer_bytes(rows));
  }
  backend_.copy_to_backend(sample_ids_.data, batch.sample_ids.data() + first,
                           static_cast<std::size_t>(rows) * sizeof(std::int64_t));
}

}  // namespace hpctrain
