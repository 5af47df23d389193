// Forward passes without gradients over a whole data split, shared by training-time evaluation and the `predict` and
// `evaluate` commands. Rank r takes samples r, r + R, r + 2R, ...: every sample exactly once, no padding.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/metrics_writer.hpp"
#include "hpctrain/nn/layer.hpp"

namespace hpctrain {

class Model;
class DeviceBatch;

struct EvalMetrics {
  std::int64_t samples = 0;
  std::int64_t positions = 0;  // sequence models: the positions scored (targets not ignored), the loss's denominator
  double loss = 0.0;
  double accuracy = NAN, top5_accuracy = NAN;  // classification (top-5 with more than 5 classes)
  double mae = NAN, mse = NAN, r2 = NAN;       // regression; r2 averaged over the outputs
};

// The samples rank `rank` of `ranks` evaluates: rank, rank + ranks, ...
std::vector<std::int64_t> evaluation_share(std::int64_t samples, int rank, int ranks);

// The model's output for one batch: the batch as read (features transformed), the output on the backend, and its fp32
// copy on the host, (batch.rows, output width), or null (HostOutputs::none).
using ForwardVisit = std::function<void(const HostBatch& batch, const TensorView& output, const float* host)>;

// Whether forward_split copies each batch's output to the host: predictions and regression metrics read it there;
// classification metrics are counted on the backend (Backend::count_class_hits), so no output leaves the device (a
// GPT-2 window's logits are 1024 x 50,304 values).
enum class HostOutputs : std::uint8_t { copied, none };

// Forward passes over this rank's share of the split (evaluation_share), local_batch rows at a time, read through the
// split's reader (TrainingData::read applies the deck's feature transforms): what evaluation and predictions share.
void forward_split(const TrainingData& data, Model& model, Backend& backend, DeviceBatch& device,
                   std::int64_t local_batch, const StepContext& context, const MpiEnvironment& mpi,
                   const ForwardVisit& visit, HostOutputs host_outputs = HostOutputs::copied);

// Metrics reduced over all ranks.
EvalMetrics evaluate_split(const TrainingData& data, Model& model, Backend& backend, DeviceBatch& device, TaskKind task,
                           std::int64_t local_batch, const StepContext& context, const MpiEnvironment& mpi);

// The columns of the evaluation table (metrics.h5 /eval, and `evaluate --output`) for a task and output width, and one
// row of it: step, loss, then accuracy (and top5_accuracy with more than 5 classes) or mae, mse, r2.
std::vector<std::pair<std::string, MetricKind>> eval_columns(TaskKind task, std::int64_t outputs);
std::vector<double> eval_row(std::int64_t step, const EvalMetrics& metrics, TaskKind task, std::int64_t outputs);

// "loss 0.1234  accuracy 0.9876" etc.
std::string describe(const EvalMetrics& metrics);

}  // namespace hpctrain
