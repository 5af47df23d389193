// The per-step record ring and its read-back.
#include "hpctrain/train/step_records.hpp"

#include <algorithm>
#include <cstddef>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

StepRecords::StepRecords(Backend& backend, std::size_t capacity)
    : backend_(backend), capacity_(std::max<std::size_t>(capacity, 1)), ring_(backend, capacity_ * sizeof(Record)) {
  pending_.reserve(capacity_);
  host_.resize(capacity_);
  losses_.resize(capacity_);
}

void StepRecords::record(std::int64_t step, std::int64_t global_rows, double loss_denominator, double start,
                         double clock_start, const LossSums* sums, const StepScalars* scalars) {
  HPCTRAIN_ASSERT(!full(), "the step record ring is full; flush it first");
  char* slot = ring_.as<char>() + pending_.size() * sizeof(Record);
  backend_.copy(slot + offsetof(Record, sums), sums, sizeof(LossSums));
  backend_.copy(slot + offsetof(Record, before_finish), scalars, sizeof(StepScalars));
  pending_.push_back({step, global_rows, loss_denominator, start, clock_start});
}

void StepRecords::record_scaler(const StepScalars* scalars) {
  HPCTRAIN_ASSERT(!pending_.empty(), "record_scaler before record");
  char* slot = ring_.as<char>() + (pending_.size() - 1) * sizeof(Record);
  backend_.copy(slot + offsetof(Record, after), scalars, sizeof(StepScalars));
}

FlushedSteps StepRecords::flush(MPI_Comm world, double clock_now) {
  FlushedSteps flushed;
  if (pending_.empty()) return flushed;
  const std::size_t count = pending_.size();
  backend_.copy_to_host(host_.data(), ring_.data, count * sizeof(Record));
  for (std::size_t i = 0; i < count; ++i) losses_[i] = host_[i].sums.loss_sum;
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, losses_.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM, world));
  std::int64_t rows = 0;
  for (const Pending& pending : pending_) rows += pending.global_rows;
  const double rate = static_cast<double>(rows) / std::max(MPI_Wtime() - pending_.front().start, 1e-9);
  flushed.clock_seconds_per_step = (clock_now - pending_.front().clock_start) / static_cast<double>(count);
  flushed.steps.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    StepResult result;
    result.step = pending_[i].step;
    result.global_rows = pending_[i].global_rows;
    result.loss = losses_[i] / pending_[i].loss_denominator;
    result.rate = rate;
    result.scale_in_effect = host_[i].before_finish.loss_scale;
    result.scalars = host_[i].after;
    result.scalars.found_nonfinite = host_[i].before_finish.found_nonfinite;
    flushed.steps.push_back(result);
  }
  pending_.clear();
  return flushed;
}

}  // namespace hpctrain
