// How a run carries on from an earlier one: starting from its weights only (train --init-from), resuming it only when
// the optimizer and schedule keys are those it was written with (or the user allowed the change: --allow-changed),
// and where the learning-rate schedule starts when train.steps was raised (--extend stretch|restart).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/train/checkpointing.hpp"

namespace hpctrain {

class Model;

// What a longer run does with its learning-rate schedule (train --extend).
enum class ScheduleExtension {
  stretch,  // the schedule spans the new length from step 0, as if the run had been planned that long (the default)
  restart,  // the schedule starts again at the resumed step: warm-up, then its decay over the steps added
};

// "stretch" / "restart"; InputError naming the valid words otherwise.
ScheduleExtension parse_schedule_extension(const std::string& word);

// Loads the parameters of the checkpoint `argument` names (a file, a run directory or its checkpoints/latest) into
// the model; nothing else of it is used. InputError naming the first tensor whose shape differs. Collective. Returns
// the checkpoint file.
std::filesystem::path initialize_from(const std::string& argument, Model& model, Backend& backend,
                                      const MpiEnvironment& mpi);

// One deck key whose value differs between a checkpoint's deck and this one, as TOML values.
struct KeyChange {
  std::string key, before, after;
};

// The optimizer.* and schedule.* keys (and model.class_weights, model.label_smoothing) whose values differ between
// `checkpoint_deck` (the resolved deck a checkpoint stores) and `config`.
std::vector<KeyChange> changed_training_keys(const std::string& checkpoint_deck, const RunConfig& config);

// Refuses (InputError, listing the keys) to resume from the newest of `candidates` whose deck can be read when an
// optimizer, schedule or loss key (model.class_weights, model.label_smoothing) changed and `allowed` (keys or whole
// sections, --allow-changed) does not name it; optimizer.type can never change. Returns the allowed changes as a log
// line ("" for none). Reads on rank 0; collective.
std::string check_resume_changes(const std::vector<std::filesystem::path>& candidates, const RunConfig& config,
                                 const std::vector<std::string>& allowed, const std::filesystem::path& run_config,
                                 const MpiEnvironment& mpi);

struct ScheduleStart {
  std::int64_t origin = 0;  // the step the schedule starts from
  std::string note;         // for the log ("" when nothing changed)
};

// Where the schedule of a run resumed at `state` starts, now that the deck runs `total_steps`. `extension` is what
// --extend asked for (nullptr: not given). InputError for --extend when the run is not extended.
ScheduleStart schedule_start(const CheckpointState& state, std::int64_t total_steps,
                             const ScheduleExtension* extension);

}  // namespace hpctrain
