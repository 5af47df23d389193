// What each training step leaves for the host, read back through one path. Every step's loss sums and scalars are
// copied into a ring in backend memory (no host synchronisation); flush() reads the ring in one copy and sums the
// steps' losses over the ranks in one all-reduce. The CPU backend flushes after every step (a ring of one); on CUDA the
// trainer flushes every train.log_every steps and before anything that needs the results (evaluation, a checkpoint,
// the end), so the GPU runs ahead of the host.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"

namespace hpctrain {

struct StepResult {
  std::int64_t step = 0;         // 0-based index of the step
  std::int64_t global_rows = 0;  // its samples over all ranks
  double loss = 0.0;             // mean over the global batch
  double rate = 0.0;             // samples/s (of the flushed window: steps ran asynchronously)
  float scale_in_effect = 1.0f;  // the loss scale the step ran with
  StepScalars scalars;           // after the step; found_nonfinite says whether its update was skipped
};

struct FlushedSteps {
  std::vector<StepResult> steps;
  double clock_seconds_per_step = 0.0;  // on the run clock, from the first flushed step's start to the flush
};

class StepRecords {
 public:
  StepRecords(Backend& backend, std::size_t capacity);

  // The step just enqueued (0-based `step`, started at `start` seconds of MPI_Wtime and `clock_start` of the run
  // clock; its mean loss is the global loss sum / loss_denominator: global_rows, or the sum of the labels' class
  // weights): its loss sums and the scalars after its optimizer update, before the loss scaler's update...
  void record(std::int64_t step, std::int64_t global_rows, double loss_denominator, double start, double clock_start,
              const LossSums* sums, const StepScalars* scalars);
  // ... and the scalars after the scaler's update.
  void record_scaler(const StepScalars* scalars);

  [[nodiscard]] bool empty() const { return pending_.empty(); }
  [[nodiscard]] bool full() const { return pending_.size() >= capacity_; }

  // Reads the recorded steps back, sums their losses over the ranks and empties the ring. Collective.
  FlushedSteps flush(MPI_Comm world, double clock_now);

 private:
  struct Record {  // one slot of the ring, in backend memory
    LossSums sums;
    StepScalars before_finish;  // after the optimizer, before the scaler update (the scale in effect, norm, skip)
    StepScalars after;          // after the scaler update
  };
  struct Pending {
    std::int64_t step = 0, global_rows = 0;
    double loss_denominator = 1.0, start = 0.0, clock_start = 0.0;
  };
  Backend& backend_;
  std::size_t capacity_;
  BackendBuffer ring_;
  std::vector<Pending> pending_;
  std::vector<Record> host_;    // read-back buffer
  std::vector<double> losses_;  // all-reduce buffer
};

}  // namespace hpctrain
