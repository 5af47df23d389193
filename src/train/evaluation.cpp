// Evaluation over a split: the loss and the classification counts on the backend; regression metrics on the host from
// the fp32 outputs.
#include "hpctrain/train/evaluation.hpp"

#include <algorithm>
#include <cstdio>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/train/device_batch.hpp"

namespace hpctrain {

std::vector<std::int64_t> evaluation_share(std::int64_t samples, int rank, int ranks) {
  std::vector<std::int64_t> mine;
  for (std::int64_t i = rank; i < samples; i += ranks) mine.push_back(i);
  return mine;
}

void forward_split(const TrainingData& data, Model& model, Backend& backend, DeviceBatch& device,
                   std::int64_t local_batch, const StepContext& context, const MpiEnvironment& mpi,
                   const ForwardVisit& visit, HostOutputs host_outputs) {
  const std::vector<std::int64_t> mine = evaluation_share(data.samples(), mpi.rank(), mpi.size());
  const std::int64_t width = model.output_width();
  const bool copied = host_outputs == HostOutputs::copied;
  const std::size_t copied_values = copied ? static_cast<std::size_t>(local_batch * width) : 0;
  BackendBuffer wide(backend, copied_values * sizeof(float));
  std::vector<float> host(copied_values);
  HostBatch batch;
  StepContext step = context;
  step.training = false;
  step.sample_ids = device.sample_ids();
  // ---- CUDA graphs (issue 15, item 16): after one eager full batch (it sizes the scratch and picks the
  // algorithms), the forward pass of a full batch (and the cast of its output when it is copied) is captured once per
  // split and replayed; uploads, read-backs and what the visitor runs (the loss, the class counts) stay outside. A
  // partial last batch runs eagerly.
  std::int64_t full_batches = 0;
  bool captured = false;
  TensorView captured_output{};
  for (std::size_t begin = 0; begin < mine.size(); begin += static_cast<std::size_t>(local_batch)) {
    const auto rows = static_cast<std::int64_t>(std::min<std::size_t>(local_batch, mine.size() - begin));
    data.read(mine.data() + begin, rows, batch);
    device.upload(batch, 0, rows, model);
    step.rows = rows;
    const bool replay = backend.supports_capture() && rows == local_batch && full_batches++ > 0;
    if (replay && !captured) backend.begin_capture(CaptureSlot::inference);
    TensorView output{};
    if (!replay || !captured) {
      output = model.forward(step);
      if (copied) backend.cast(output, {wide.data, DType::f32, rows, width});
    }
    if (replay) {
      if (!captured) {
        backend.end_capture(CaptureSlot::inference);
        captured_output = output;  // the model's output buffer: the same at every replay
        captured = true;
      }
      backend.replay_capture(CaptureSlot::inference);
      output = captured_output;
    }
    if (copied) backend.copy_to_host(host.data(), wide.data, static_cast<std::size_t>(rows * width) * sizeof(float));
    visit(batch, output, copied ? host.data() : nullptr);
  }
}

EvalMetrics evaluate_split(const TrainingData& data, Model& model, Backend& backend, DeviceBatch& device, TaskKind task,
                           std::int64_t local_batch, const StepContext& context, const MpiEnvironment& mpi) {
  // A sequence model scores every position: rows * T rows of `width` classes against the token targets.
  const std::int64_t positions = model.positions(), width = model.classes();
  const bool classification = task == TaskKind::classification;
  BackendBuffer sums_buffer(backend, sizeof(LossSums));
  backend.zero(sums_buffer.data, sizeof(LossSums));
  // classification: (argmax hits, top-5 hits) counted on the backend from the output and the uploaded targets
  BackendBuffer hits_buffer(backend, 2 * sizeof(double));
  backend.zero(hits_buffer.data, 2 * sizeof(double));
  // reduced: loss sum, argmax hits, top-5 hits, |error| sum, then per output: sum t, sum t^2, sum (p - t)^2, and last
  // the loss's denominator (samples, or with class weights the sum of the labels' weights, or the scored positions: the
  // training loss's mean). The per-output sums are regression's only (a GPT's 50,304 classes need none).
  std::vector<double> totals(5 + (classification ? 0 : 3 * static_cast<std::size_t>(width)), 0.0);
  forward_split(
      data, model, backend, device, local_batch, context, mpi,
      [&](const HostBatch& batch, const TensorView& output, const float* host) {
        model.apply_loss(batch.rows, nullptr, sums_buffer.as<LossSums>());
        const std::int64_t scored_rows = batch.rows * positions;
        const std::int32_t* labels = positions > 1 ? batch.token_targets.data() : batch.labels.data();
        totals.back() += positions > 1    ? Loss::counted_targets(labels, scored_rows)
                         : classification ? model.loss().label_weight_sum(labels, batch.rows)
                                          : static_cast<double>(batch.rows);
        if (classification) {  // each scored position a row of `width` class scores
          const TensorView scores{output.data, output.dtype, scored_rows, width};
          backend.count_class_hits(scores, static_cast<const std::int32_t*>(model.loss().answers()),
                                   hits_buffer.as<double>(), true);
          return;
        }
        for (std::int64_t row = 0; row < scored_rows; ++row) {
          const float* prediction = host + row * width;
          for (std::int64_t k = 0; k < width; ++k) {
            const double target = batch.targets[static_cast<std::size_t>(row * width + k)];
            const double error = prediction[k] - target;
            totals[3] += std::abs(error);
            totals[4 + 3 * k] += target;
            totals[5 + 3 * k] += target * target;
            totals[6 + 3 * k] += error * error;
          }
        }
      },
      classification ? HostOutputs::none : HostOutputs::copied);
  LossSums sums;
  backend.copy_to_host(&sums, sums_buffer.data, sizeof sums);
  totals[0] = sums.loss_sum;
  if (classification) backend.copy_to_host(&totals[1], hits_buffer.data, 2 * sizeof(double));  // totals[1], [2]
  HPCTRAIN_MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, totals.data(), static_cast<int>(totals.size()), MPI_DOUBLE, MPI_SUM, mpi.world()));
  EvalMetrics metrics;
  metrics.samples = data.samples();
  const auto n = static_cast<double>(data.samples());
  metrics.loss = totals[0] / totals.back();
  if (positions > 1) metrics.positions = static_cast<std::int64_t>(totals.back());
  if (classification) {
    const double scored = positions > 1 ? totals.back() : n;  // accuracies per scored position of a sequence model
    metrics.accuracy = totals[1] / scored;
    if (width > 5) metrics.top5_accuracy = totals[2] / scored;
  } else {
    metrics.mae = totals[3] / (n * static_cast<double>(width));
    double residual = 0.0, r2 = 0.0;
    for (std::int64_t k = 0; k < width; ++k) {
      const double sum = totals[4 + 3 * k], squares = totals[5 + 3 * k], errors = totals[6 + 3 * k];
      residual += errors;
      const double total_variation = squares - sum * sum / n;
      r2 += total_variation > 0 ? 1.0 - errors / total_variation : NAN;
    }
    metrics.mse = residual / (n * static_cast<double>(width));
    metrics.r2 = r2 / static_cast<double>(width);
  }
  return metrics;
}

std::vector<std::pair<std::string, MetricKind>> eval_columns(TaskKind task, std::int64_t outputs) {
  std::vector<std::pair<std::string, MetricKind>> columns{{"step", MetricKind::int64}, {"loss", MetricKind::float64}};
  if (task == TaskKind::regression) {
    for (const char* name : {"mae", "mse", "r2"}) columns.emplace_back(name, MetricKind::float64);
  } else {
    columns.emplace_back("accuracy", MetricKind::float64);
    if (outputs > 5) columns.emplace_back("top5_accuracy", MetricKind::float64);
  }
  return columns;
}

std::vector<double> eval_row(std::int64_t step, const EvalMetrics& metrics, TaskKind task, std::int64_t outputs) {
  std::vector<double> row{static_cast<double>(step), metrics.loss};
  if (task == TaskKind::regression) {
    row.insert(row.end(), {metrics.mae, metrics.mse, metrics.r2});
  } else {
    row.push_back(metrics.accuracy);
    if (outputs > 5) row.push_back(metrics.top5_accuracy);
  }
  return row;
}

std::string describe(const EvalMetrics& metrics) {
  char text[200];
  if (!std::isnan(metrics.accuracy)) {
    const int length = std::snprintf(text, sizeof text, "loss %.5f  accuracy %.4f", metrics.loss, metrics.accuracy);
    if (!std::isnan(metrics.top5_accuracy))
      std::snprintf(text + length, sizeof text - static_cast<std::size_t>(length), "  top-5 %.4f",
                    metrics.top5_accuracy);
  } else {
    std::snprintf(text, sizeof text, "loss (mse) %.6g  mae %.6g  r2 %.5f", metrics.loss, metrics.mae, metrics.r2);
  }
  return text;
}

}  // namespace hpctrain
