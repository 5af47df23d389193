// One optimizer step on the backend, and the CUDA-graph wrapper around it.
//
// TrainingStep::run enqueues, for this rank's rows of a global batch:
//   micro-batches of micro_rows rows: upload; forward; loss (its gradient pre-scaled by loss scale / global rows, or
//   with class weights / the global batch's sum of its labels' weights: summed on the host, all-reduced before the
//   step and uploaded like the learning rate, so a captured graph reads each step's value);
//   backward (accumulating into the gradient buffer; the last micro-batch's backward all-reduces gradient buckets as
//   they complete); then the rest of the all-reduce, the gradient statistics (non-finite check on the still-scaled
//   gradients, global norm, clip coefficient), the fused optimizer update (skipped after non-finite gradients), and
//   the loss scaler's update. The step's results are recorded into StepRecords; nothing is read back here.
// StepGraph wraps the part of a step a CUDA graph can hold (everything from the loss scale to the optimizer, for a
// step of one full micro-batch; the upload stays outside): after warm-up it captures that part once and replays it.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/optim/optimizer.hpp"
#include "hpctrain/precision/loss_scaler.hpp"
#include "hpctrain/train/device_batch.hpp"
#include "hpctrain/train/phase_timer.hpp"
#include "hpctrain/train/step_records.hpp"

namespace hpctrain {

// Eager steps before a step is captured: they size every scratch buffer and choose every cuBLASLt algorithm, so the
// capture allocates nothing.
inline constexpr std::int64_t graph_warmup_steps = 3;

class StepGraph {
 public:
  // enabled: run.cuda_graphs and the run allows it; steps before first_capture run eagerly (warm-up).
  StepGraph(Backend& backend, bool enabled, std::int64_t first_capture)
      : backend_(backend), enabled_(enabled), first_capture_(first_capture) {}
  [[nodiscard]] bool enabled() const { return enabled_; }
  // Runs `compute` (the graphable part of step `step`): eagerly during warm-up, captured once then replayed after.
  // (A template, not std::function: wrapping the step's lambda would allocate on every step.)
  template <class Compute>
  void run(std::int64_t step, Compute&& compute) {
    if (ready_) {
      replay();
      return;
    }
    if (!enabled_ || step < first_capture_) {
      compute();
      return;
    }
    begin_capture();
    compute();
    end_capture_and_replay();
  }

 private:
  void replay();
  void begin_capture();
  void end_capture_and_replay();

  Backend& backend_;
  bool enabled_;
  std::int64_t first_capture_;
  bool ready_ = false;
};

class TrainingStep {
 public:
  // micro_rows: rows per micro-batch on this rank; global rows of a step = this rank's rows x the ranks of world.
  TrainingStep(Backend& backend, Model& model, Optimizer& optimizer, GradientExchange& exchange, LossScaler& scaler,
               DeviceBatch& device, std::int64_t micro_rows, MPI_Comm world, std::uint64_t seed, PhaseTimer& timer);

  // Enqueues step `step` (0-based) on this rank's rows of the batch at the given learning rate; records its results.
  // source: BatchSource::loader_ring when the batch lives in a BatchLoader's ring (CUDA uploads it by DMA).
  void run(const HostBatch& batch, std::int64_t step, float learning_rate, StepGraph& graph, StepRecords& records,
           double start, double clock_start, BatchSource source = BatchSource::transient);

 private:
  // Forward, loss and backward of one micro-batch already uploaded; `first` also sets the loss-gradient factor and
  // clears the loss sums, `last` all-reduces gradient buckets during backward.
  void micro_batch(std::int64_t step, std::int64_t rows, float global_rows, bool first, bool last);
  // The denominator of the step's mean loss: global rows, or with class weights the global batch's sum of its labels'
  // weights, or for a sequence model the global batch's count of scored targets (one all-reduce of one number), which
  // is then uploaded for the loss gradient's factor.
  double loss_denominator(const HostBatch& batch, std::int64_t global_rows);
  // The all-reduce's end, the gradient statistics and the optimizer update.
  void update();

  Backend& backend_;
  Model& model_;
  Optimizer& optimizer_;
  GradientExchange& exchange_;
  LossScaler& scaler_;
  DeviceBatch& device_;
  std::int64_t micro_rows_;
  MPI_Comm world_;
  int ranks_ = 1;
  std::uint64_t seed_;
  PhaseTimer& timer_;
  BackendBuffer sums_, gradient_scale_;  // this step's loss sums; the loss gradient's factor (backend memory)
  BackendBuffer label_weights_;  // float: the global batch's sum of its labels' class weights, or scored targets
};

}  // namespace hpctrain
