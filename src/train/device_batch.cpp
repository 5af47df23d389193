// Moving a host batch to the backend, and the loss.
#include "hpctrain/train/device_batch.hpp"

#include <algorithm>

#include "hpctrain/nn/model.hpp"

namespace hpctrain {

DeviceBatch::DeviceBatch(Backend& backend, const Model& model, TaskKind task, std::int64_t max_rows)
    : backend_(backend), task_(task) {
  labels_ = BackendBuffer(backend, static_cast<std::size_t>(max_rows) * sizeof(std::int32_t));
  targets_ = BackendBuffer(backend, static_cast<std::size_t>(max_rows * model.output_width()) * sizeof(float));
  sample_ids_ = BackendBuffer(backend, static_cast<std::size_t>(max_rows) * sizeof(std::int64_t));
  seen_.reserve(16);  // a loader's ring slots: nothing allocated in a step
  pinned_.reserve(16);
}

DeviceBatch::~DeviceBatch() {
  for (const void* pointer : pinned_) backend_.unpin_host_memory(pointer);
}

void DeviceBatch::upload(const HostBatch& batch, std::int64_t first, std::int64_t rows, Model& model,
                         BatchSource source_kind) {
  const std::int64_t features = model.input_width();
  const TensorView input = model.input(rows);
  const void* buffer = batch.features.data();
  if (source_kind == BatchSource::loader_ring && buffer != nullptr &&
      std::find(seen_.begin(), seen_.end(), buffer) == seen_.end()) {  // once per ring slot
    seen_.push_back(buffer);
    if (backend_.pin_host_memory(buffer, batch.features.capacity() * sizeof(float))) pinned_.push_back(buffer);
  }
  backend_.upload_cast(batch.features.data() + first * features, input);
  if (task_ == TaskKind::classification && !batch.labels.empty()) {  // predictions need no labels
    backend_.copy_to_backend(labels_.data, batch.labels.data() + first,
                             static_cast<std::size_t>(rows) * sizeof(std::int32_t));
  } else if (task_ == TaskKind::regression && !batch.targets.empty()) {
    const std::int64_t outputs = model.output_width();
    backend_.copy_to_backend(targets_.data, batch.targets.data() + first * outputs,
                             static_cast<std::size_t>(rows * outputs) * sizeof(float));
  }
  backend_.copy_to_backend(sample_ids_.data, batch.sample_ids.data() + first,
                           static_cast<std::size_t>(rows) * sizeof(std::int64_t));
}

void DeviceBatch::loss(const TensorView& output, const float* gradient_scale, LossSums* sums) const {
  TensorView gradient = output;
  if (gradient_scale == nullptr) gradient.data = nullptr;
  if (task_ == TaskKind::classification)
    backend_.softmax_cross_entropy(output, labels_.as<std::int32_t>(), gradient_scale, gradient, sums);
  else
    backend_.mean_squared_error(output, targets_.data, gradient_scale, gradient, sums);
}

}  // namespace hpctrain
