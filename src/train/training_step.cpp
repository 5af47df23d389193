// One optimizer step, and its graph wrapper.
#include "hpctrain/train/training_step.hpp"

#include <algorithm>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

// The step's own graph slot (evaluation captures into CaptureSlot::inference).
void StepGraph::replay() { backend_.replay_capture(CaptureSlot::step); }

void StepGraph::begin_capture() { backend_.begin_capture(CaptureSlot::step); }

void StepGraph::end_capture_and_replay() {
  backend_.end_capture(CaptureSlot::step);
  backend_.replay_capture(CaptureSlot::step);  // the capture recorded the step without running it
  ready_ = true;
}

TrainingStep::TrainingStep(Backend& backend, Model& model, Optimizer& optimizer, GradientExchange& exchange,
                           LossScaler& scaler, DeviceBatch& device, std::int64_t micro_rows, MPI_Comm world,
                           std::uint64_t seed, PhaseTimer& timer)
    : backend_(backend),
      model_(model),
      optimizer_(optimizer),
      exchange_(exchange),
      scaler_(scaler),
      device_(device),
      micro_rows_(micro_rows),
      world_(world),
      seed_(seed),
      timer_(timer),
      sums_(backend, sizeof(LossSums)),
      gradient_scale_(backend, sizeof(float)) {
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(world, &ranks_));
  if (model.loss().weighted() || model.positions() > 1) label_weights_ = BackendBuffer(backend, sizeof(float));
  if (exchange.sharded())
    optimizer.shard(exchange.owned(), [&exchange](std::span<double> values) { exchange.add_over_ranks(values); });
}

void TrainingStep::micro_batch(std::int64_t step, std::int64_t rows, float global_rows, bool first, bool last) {
  if (first) {
    scaler_.begin_step(global_rows, label_weights_.as<float>(), gradient_scale_.as<float>());
    backend_.zero(sums_.data, sizeof(LossSums));
  }
  const StepContext context{&backend_, true, seed_, static_cast<std::uint32_t>(step), device_.sample_ids(), rows};
  model_.forward(context);
  model_.apply_loss(rows, gradient_scale_.as<float>(), sums_.as<LossSums>());
  timer_.begin(Phase::backward);
  if (last) {
    exchange_.begin_step();
    model_.backward(context, !first, [&](std::int64_t begin) { exchange_.ready_from(begin); });
  } else {
    model_.backward(context, !first, nullptr);
  }
}

void TrainingStep::update() {
  timer_.begin(Phase::allreduce);
  exchange_.finish();
  timer_.begin(Phase::optimizer);
  optimizer_.gradient_statistics(scaler_.device());
  optimizer_.step(scaler_.device());
  if (exchange_.sharded()) {  // a sharded update: every rank gathers the parameters the others updated
    timer_.begin(Phase::allreduce);
    exchange_.gather_owned(model_.master(), sizeof(float));
    const TensorView working = model_.working_copy();
    if (working.data != nullptr) exchange_.gather_owned(working.data, dtype_size(working.dtype));
  }
}

double TrainingStep::loss_denominator(const HostBatch& batch, std::int64_t global_rows) {
  const Loss& loss = model_.loss();
  const bool sequence = model_.positions() > 1;
  if (!loss.weighted() && !sequence) return static_cast<double>(global_rows);
  double sum = sequence ? Loss::counted_targets(batch.token_targets.data(), batch.rows * model_.positions())
                        : loss.label_weight_sum(batch.labels.data(), batch.rows);
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, world_));
  const auto value = static_cast<float>(sum);
  backend_.copy_to_backend(label_weights_.data, &value, sizeof value);  // outside the graph, as the learning rate
  return sum;
}

void TrainingStep::run(const HostBatch& batch, std::int64_t step, float learning_rate, StepGraph& graph,
                       StepRecords& records, double start, double clock_start, BatchSource source) {
  scaler_.set_learning_rate(learning_rate);
  const std::int64_t global_rows = batch.rows * ranks_;
  const auto global = static_cast<float>(global_rows);
  const double denominator = loss_denominator(batch, global_rows);
  const std::int64_t micro_batches = (batch.rows + micro_rows_ - 1) / micro_rows_;
  if (micro_batches == 1 && batch.rows == micro_rows_) {  // the shape a graph can hold
    timer_.begin(Phase::forward);
    device_.upload(batch, 0, batch.rows, model_, source);
    graph.run(step, [&] {
      micro_batch(step, batch.rows, global, true, true);
      update();
    });
  } else {  // micro-batches accumulate into the gradient buffer; only the last one's backward all-reduces
    for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
      const std::int64_t first = micro * micro_rows_;
      const std::int64_t rows = std::min(micro_rows_, batch.rows - first);
      timer_.begin(Phase::forward);
      device_.upload(batch, first, rows, model_, source);
      micro_batch(step, rows, global, micro == 0, micro + 1 == micro_batches);
    }
    update();
  }
  timer_.begin(Phase::optimizer);
  records.record(step, global_rows, denominator, start, clock_start, sums_.as<LossSums>(), scaler_.device());
  scaler_.finish_step();
  records.record_scaler(scaler_.device());
}

}  // namespace hpctrain
