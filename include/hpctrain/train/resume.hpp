// How a run starts: the plan (fresh, or the checkpoints to continue from) decided on rank 0 from the output directory
// and agreed by every rank, then loading the newest sound checkpoint of the plan. A damaged checkpoint
// (CheckpointDamaged) is passed over for an older one; a checkpoint that does not fit the deck (CheckpointMismatch)
// ends the start at once, since an older one of the same run would not fit either.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/train/checkpointing.hpp"
#include "hpctrain/train/run_directory.hpp"

namespace hpctrain {

class Model;
class Optimizer;

// Decided on rank 0 (plan_start on the output directory), the same on every rank. Collective.
StartPlan agree_start_plan(const RunConfig& config, const MpiEnvironment& mpi, const std::string& resume, bool force);

struct ResumedRun {
  bool resumed = false;
  std::filesystem::path from;            // the checkpoint loaded
  CheckpointState state;                 // its step, data position and scalars
  std::vector<std::string> passed_over;  // damaged newer checkpoints, newest first, as messages
  double read_seconds = 0.0;
};

// Loads the newest sound checkpoint of the plan into the model and optimizer (collective); an empty plan is a fresh
// start. `config_path` is the run's config.toml, suggested when a checkpoint does not fit the deck.
ResumedRun resume_from(const StartPlan& plan, Model& model, Optimizer& optimizer, Backend& backend,
                       const MpiEnvironment& mpi, const std::filesystem::path& config_path);

}  // namespace hpctrain
