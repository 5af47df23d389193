// Moving a host batch to the backend.
#include "hpctrain/train/device_batch.hpp"

#include <algorithm>

#include "hpctrain/nn/model.hpp"

namespace hpctrain {

DeviceBatch::DeviceBatch(Backend& backend, const Model&, std::int64_t max_rows) : backend_(backend) {
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
  if (model.token_ids() != nullptr) {  // token windows: ids in, the next token at every position as the answers
    const auto count = static_cast<std::size_t>(rows * features);
    backend_.copy_to_backend(model.token_ids(), batch.tokens.data() + first * features, count * sizeof(std::int32_t));
    if (!batch.token_targets.empty())
      backend_.copy_to_backend(model.loss().answers(), batch.token_targets.data() + first * features,
                               count * sizeof(std::int32_t));
    backend_.copy_to_backend(sample_ids_.data, batch.sample_ids.data() + first,
                             static_cast<std::size_t>(rows) * sizeof(std::int64_t));
    return;
  }
  const TensorView input = model.input(rows);
  const void* buffer = batch.features.data();
  if (source_kind == BatchSource::loader_ring && buffer != nullptr &&
      std::find(seen_.begin(), seen_.end(), buffer) == seen_.end()) {  // once per ring slot
    seen_.push_back(buffer);
    if (backend_.pin_host_memory(buffer, batch.features.capacity() * sizeof(float))) pinned_.push_back(buffer);
  }
  backend_.upload_cast(batch.features.data() + first * features, input);
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
