// Optimizer: state allocation and the fused update over the flat buffers.
#include "hpctrain/optim/optimizer.hpp"

#include <algorithm>
#include <utility>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {

Optimizer::Optimizer(const OptimizerSection& section, Model& model, Backend& backend)
    : model_(model), backend_(backend) {
  HPCTRAIN_ASSERT(model.buffers().master_dtype == DType::f32, "the optimizer updates fp32 master parameters");
  switch (section.type) {
    case OptimizerKind::adamw:
      hyper_.type = OptimizerType::adamw;
      break;
    case OptimizerKind::sgd:
      hyper_.type = OptimizerType::sgd;
      break;
  }
  hyper_.beta1 = static_cast<float>(section.beta1);
  hyper_.beta2 = static_cast<float>(section.beta2);
  hyper_.eps = static_cast<float>(section.eps);
  hyper_.momentum = static_cast<float>(section.momentum);
  hyper_.nesterov = section.nesterov;
  hyper_.weight_decay = static_cast<float>(section.weight_decay);
  hyper_.max_grad_norm = static_cast<float>(section.grad_clip);

  // Weight decay applies to every parameter except those named by optimizer.no_decay: a word matches a parameter's
  // name ("bias") or its layer's type ("norm" matches layernorm), the usual AdamW practice.
  for (const ParameterEntry& entry : model.parameter_entries()) {
    bool decays = true;
    for (const std::string& word : section.no_decay)
      if (entry.name.find(word) != std::string::npos || entry.layer_type.find(word) != std::string::npos)
        decays = false;
    if (!ranges_.empty() && ranges_.back().decay == decays &&
        ranges_.back().offset + ranges_.back().count == entry.offset)
      ranges_.back().count += entry.count;
    else
      ranges_.push_back({entry.offset, entry.count, decays});
  }
  const bool needs_first = hyper_.type == OptimizerType::adamw || hyper_.momentum > 0.0f;
  const bool needs_second = hyper_.type == OptimizerType::adamw;
  const std::size_t bytes = static_cast<std::size_t>(model.parameter_count()) * sizeof(float);
  if (needs_first) state_[0] = BackendBuffer(backend, bytes);
  if (needs_second) state_[1] = BackendBuffer(backend, bytes);
  for (const BackendBuffer& state : state_)
    if (state.data != nullptr) backend.zero(state.data, bytes);
}

Optimizer::~Optimizer() = default;

void Optimizer::shard(std::span<const ElementRange> owned, std::function<void(std::span<double>)> add_over_ranks) {
  sharded_ = true;
  owned_.assign(owned.begin(), owned.end());
  add_over_ranks_ = std::move(add_over_ranks);
}

void Optimizer::gradient_statistics(StepScalars* scalars) {
  const auto* gradients = static_cast<const float*>(model_.gradients());
  const std::int64_t count = model_.parameter_count();
  if (!sharded_) {
    backend_.gradient_statistics(gradients, count, hyper_, scalars);
    return;
  }
  const std::int64_t chunks = (count + Backend::gradient_statistics_chunk - 1) / Backend::gradient_statistics_chunk;
  // Other ranks' chunks stay 0 here, so the sum over the ranks is exact.
  partials_.assign(static_cast<std::size_t>(2 * chunks), 0.0);
  backend_.gradient_chunk_statistics(gradients, count, owned_, partials_.data());
  add_over_ranks_(partials_);
  backend_.statistics_from_chunks(partials_.data(), chunks, hyper_, scalars);
}

void Optimizer::step(const StepScalars* scalars) {
  auto* parameters = static_cast<float*>(model_.master());
  const auto* gradients = static_cast<const float*>(model_.gradients());
  const TensorView working = model_.working_copy();
  const auto update = [&](std::int64_t offset, std::int64_t count, bool decay) {
    const TensorView working_range{
        working.data ? static_cast<char*>(working.data) + offset * static_cast<std::int64_t>(dtype_size(working.dtype))
                     : nullptr,
        working.dtype, count, 1};
    backend_.optimizer_step(hyper_, decay, parameters + offset, gradients + offset,
                            state_[0].data ? state(0) + offset : nullptr, state_[1].data ? state(1) + offset : nullptr,
                            count, working_range, scalars);
  };
  for (const Range& range : ranges_) {
    if (!sharded_) {
      update(range.offset, range.count, range.decay);
      continue;
    }
    for (const ElementRange& mine : owned_) {  // the update is element-wise: any split of a range gives the same bits
      const std::int64_t begin = std::max(mine.begin, range.offset);
      const std::int64_t end = std::min(mine.end, range.offset + range.count);
      if (begin < end) update(begin, end - begin, range.decay);
    }
  }
}

}  // namespace hpctrain
