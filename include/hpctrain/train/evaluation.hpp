// Forward passes without gradients over a whole data split, shared by training-time evaluation and the `predict` and
// `evaluate` commands. Rank r takes samples r, r + R, r + 2R, ...: every sample exactly once, no padding.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/nn/layer.hpp"

namespace hpctrain {

class Model;
class DeviceBatch;

struct EvalMetrics {
  std::int64_t samples = 0;
  double loss = 0.0;
  double accuracy = NAN, top5_accuracy = NAN;  // classification (top-5 with more than 5 classes)
  double mae = NAN, mse = NAN, r2 = NAN;        // regression; r2 averaged over the outputs
};

// The samples rank `rank` of `ranks` evaluates: rank, rank + ranks, ...
std::vector<std::int64_t> evaluation_share(std::int64_t samples, int rank, int ranks);

// Metrics reduced over all ranks. If outputs is not null, this rank's model outputs (fp32, rows in the order of
// evaluation_share) are stored there.
EvalMetrics evaluate_split(TrainingData& data, Model& model, Backend& backend, DeviceBatch& device, TaskKind task,
                           std::int64_t local_batch, const StepContext& context, const MpiEnvironment& mpi,
                           std::vector<float>* outputs = nullptr);

// "loss 0.1234  accuracy 0.9876" etc.
std::string describe(const EvalMetrics& metrics);

}  // namespace hpctrain
