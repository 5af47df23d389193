// The optimizer over the model's flat buffers: its state vectors (SGD momentum; AdamW m and v) and one fused update per
// run of parameters that share a weight-decay setting.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"

namespace hpctrain {

class Model;
struct OptimizerSection;

class Optimizer {
 public:
  Optimizer(const OptimizerSection& section, Model& model, Backend& backend);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  [[nodiscard]] const OptimizerHyper& hyper() const { return hyper_; }
  // Shards the update over the ranks (GradientExchange::owned): from now on this rank computes the gradient norm's
  // chunks and the update of `owned` only (whole Backend::gradient_statistics_chunk chunks, ascending; may be none),
  // and `add_over_ranks` sums the norm's partials over the ranks. The caller gathers the updated parameters.
  void shard(std::span<const ElementRange> owned, std::function<void(std::span<double>)> add_over_ranks);
  [[nodiscard]] bool sharded() const { return sharded_; }
  // Sharded: the elements this rank updates, whose state it alone keeps current (a checkpoint writes and reads only
  // these of it).
  [[nodiscard]] std::span<const ElementRange> owned() const { return owned_; }
  // Statistics of the all-reduced gradients (norm, non-finite flag, clip coefficient) into scalars.
  void gradient_statistics(StepScalars* scalars);
  // The fused update (skipped on the backend when scalars->found_nonfinite).
  void step(const StepScalars* scalars);
  [[nodiscard]] float* state(int index) const { return state_[index].as<float>(); }  // nullptr if unused

 private:
  struct Range {
    std::int64_t offset, count;
    bool decay;
  };
  Model& model_;
  Backend& backend_;
  OptimizerHyper hyper_;
  std::vector<Range> ranges_;  // consecutive parameters with the same decay setting, merged
  BackendBuffer state_[2];
  bool sharded_ = false;
  std::vector<ElementRange> owned_;  // sharded: the elements this rank updates
  std::function<void(std::span<double>)> add_over_ranks_;
  std::vector<double> partials_;  // sharded: (2, chunks) the gradient norm's partials
};

}  // namespace hpctrain
