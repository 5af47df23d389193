// What a training run keeps in a checkpoint, and under which names: the model's parameters and the optimizer's state
// vectors under PyTorch's names, the loss scaler, the position in the data, the seed and the step. The files
// themselves (parallel writes, commit, checksums, `latest`, rotation) are io/checkpoint.hpp's. Layout
// (docs/file-formats.md):
//   /model/<layer>/<param>                    fp32, PyTorch's shapes (linear weight: out x in)
//   /optimizer/<state>/<layer>/<param>        exp_avg, exp_avg_sq (AdamW) or momentum_buffer (SGD); attrs type, step
//   /precision/loss_scale, growth_tracker, consecutive_skips
//   /data/epoch, /data/step_in_epoch          position in the (rank-count independent) global data order
//   /rng/seed                                 all randomness is counter-based: the seed is the whole state
//   /train/step                               optimizer steps completed
//   /train/best_step, best_value, evaluations_without_improvement; /train attribute best_metric
//                                             (runs with checkpoint.best_metric only)
//   /schedule/origin, /schedule/total_steps   where the learning-rate schedule starts, the run's length (both optional)
//   root attributes: format, hpctrain_version, world_size, input_features, deck (the resolved deck text), run_id (the
//   run that wrote it)
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/train/best_checkpoint.hpp"

namespace hpctrain {

class Model;
class Optimizer;

// The scalars of a run besides the flat buffers.
struct CheckpointState {
  std::int64_t step = 0;  // optimizer steps completed (the next step to run)
  std::int64_t epoch = 0, step_in_epoch = 0;
  StepScalars scalars;
  std::uint64_t seed = 0;
  bool watches_best = false;  // saving: store `best` (a run with checkpoint.best_metric); loading: the file had it
  BestMetric best_metric = BestMetric::none;  // the metric `best` is about
  BestState best;                             // the best-checkpoint and early-stopping decision so far
  // The learning-rate schedule: the step it started from (0, or where an extended run restarted it) and the run's
  // length when the checkpoint was written (-1: not recorded, a checkpoint of an older hpctrain).
  std::int64_t schedule_origin = 0, schedule_total_steps = -1;
};

// A run's checkpoints (OUTPUT/checkpoints).
class CheckpointStore {
 public:
  // directory: OUTPUT/checkpoints; keep: newest checkpoints kept (0 = all); run_id: stored in every checkpoint.
  CheckpointStore(std::filesystem::path directory, const MpiEnvironment& mpi, std::int64_t keep,
                  std::string run_id = {});

  // Write and commit a checkpoint of the current state (collective). Returns its final path. A failed write (a full
  // disk) throws one Error saying why, removes the partial file and leaves the previous checkpoint committed.
  // best: this checkpoint becomes checkpoints/best (kept whatever checkpoint.keep says).
  std::string save(const Model& model, const Optimizer& optimizer, Backend& backend, const CheckpointState& state,
                   const std::string& deck_text, bool best = false);

  // Checkpoint files, newest first: the one `latest` names, then the others by step.
  [[nodiscard]] std::vector<std::filesystem::path> candidates() const { return files_.candidates(); }
  // Removes the checkpoints past `step` (a run continued from an older checkpoint abandons them). Rank 0 only;
  // returns how many were removed.
  std::size_t discard_after(std::int64_t step) const { return files_.discard_after(step); }
  [[nodiscard]] const std::filesystem::path& directory() const { return files_.directory(); }

 private:
  CheckpointDirectory files_;
  const MpiEnvironment& mpi_;
};

// Load a checkpoint into the model, the optimizer and state (collective). Throws CheckpointDamaged when the file cannot
// be read (checksum, truncation, damaged metadata) and CheckpointMismatch when it does not match the model (naming the
// first mismatching tensor) or the optimizer.
void load_checkpoint(const std::string& path, Model& model, Optimizer& optimizer, Backend& backend,
                     CheckpointState& state, const MpiEnvironment& mpi);

// Load only the model parameters (inference): no optimizer state is read or kept. Collective.
void load_parameters(const std::string& path, Model& model, Backend& backend, const MpiEnvironment& mpi);

// The resolved deck a checkpoint was written with (its `deck` attribute). Throws InputError if it is not a checkpoint.
std::string checkpoint_deck(const std::string& path);

// The input features per sample of the model a checkpoint holds (its `input_features` attribute).
std::int64_t checkpoint_input_features(const std::string& path);

}  // namespace hpctrain
