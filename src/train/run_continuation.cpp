// Starting from another run's weights, resuming with checked optimizer/schedule keys, extending a run.
#include "hpctrain/train/run_continuation.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <string_view>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/suggestions.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

namespace {

// The keys of [model] that shape the training objective without changing the model's tensors: a resume checks them
// like the optimizer and schedule keys.
constexpr std::string_view loss_keys[] = {"model.class_weights", "model.label_smoothing"};

bool is_loss_key(const std::string& key) {
  return std::find(std::begin(loss_keys), std::end(loss_keys), key) != std::end(loss_keys);
}

// "section.key" -> its TOML value, for the [optimizer] and [schedule] tables and the loss keys of [model] of a
// resolved deck (to_toml's layout: one "key = value" line per key).
std::map<std::string, std::string> training_keys(const std::string& deck) {
  std::map<std::string, std::string> keys;
  std::istringstream lines(deck);
  std::string section;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("[")) {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const std::size_t equals = line.find(" = ");
    if (equals == std::string::npos) continue;
    const std::string key = section + "." + line.substr(0, equals);
    if (section == "optimizer" || section == "schedule" || is_loss_key(key)) keys[key] = line.substr(equals + 3);
  }
  return keys;
}

// A stored deck in this version's resolved form (defaults of keys added since filled in); as stored if it no longer
// parses.
std::string normalized_deck(const std::string& deck) {
  try {
    return to_toml(parse_run_config(deck, "checkpoint deck"));
  } catch (const InputError&) {
    return deck;
  }
}

bool allows(const std::vector<std::string>& allowed, const std::string& key) {
  return std::any_of(allowed.begin(), allowed.end(),
                     [&](const std::string& entry) { return entry == key || key.starts_with(entry + "."); });
}

}  // namespace

ScheduleExtension parse_schedule_extension(const std::string& word) {
  if (word == "stretch") return ScheduleExtension::stretch;
  if (word == "restart") return ScheduleExtension::restart;
  throw InputError("hpctrain train: --extend " + word + ": not a choice",
                   "--extend stretch (the schedule spans the new length) or --extend restart (warm-up and decay "
                   "again from the resumed step); see 'hpctrain train --help'");
}

fs::path initialize_from(const std::string& argument, Model& model, Backend& backend, const MpiEnvironment& mpi) {
  const fs::path checkpoint = resolve_checkpoint(argument);
  try {
    load_parameters(checkpoint.string(), model, backend, mpi);
  } catch (const CheckpointMismatch& error) {
    throw InputError(std::string("--init-from: ") + error.what(),
                     "--init-from needs a checkpoint of the same layers and widths (the optimizer, schedule, "
                     "precision and rank count may differ); 'h5ls -r " +
                         checkpoint.string() + "/model' lists its tensors");
  }
  return checkpoint;
}

std::vector<KeyChange> changed_training_keys(const std::string& checkpoint_deck, const RunConfig& config) {
  const auto before = training_keys(normalized_deck(checkpoint_deck));
  const auto after = training_keys(to_toml(config));
  std::vector<KeyChange> changes;
  for (const auto& [key, value] : after) {
    const auto found = before.find(key);
    const std::string old_value = found == before.end() ? "(not set)" : found->second;
    if (old_value != value) changes.push_back({key, old_value, value});
  }
  return changes;
}

std::string check_resume_changes(const std::vector<fs::path>& candidates, const RunConfig& config,
                                 const std::vector<std::string>& allowed, const fs::path& run_config,
                                 const MpiEnvironment& mpi) {
  const std::vector<std::string> accepted = accepted_keys();
  for (const std::string& entry : allowed) {
    const auto checked = [](const std::string& key) {
      return key.starts_with("optimizer.") || key.starts_with("schedule.") || is_loss_key(key);
    };
    const bool known = entry == "optimizer" || entry == "schedule" ||
                       (checked(entry) && std::find(accepted.begin(), accepted.end(), entry) != accepted.end());
    if (!known) {
      std::vector<Suggestion> candidates;
      for (const std::string& key : accepted)
        if (checked(key)) candidates.push_back({key, key});
      throw InputError("hpctrain train: --allow-changed " + entry +
                           ": not an optimizer, schedule or loss key (model.class_weights, model.label_smoothing)" +
                           did_you_mean(closest_name(entry, candidates)),
                       "name keys as in the deck (optimizer.lr, schedule.type, model.label_smoothing) or a whole "
                       "section (optimizer, schedule)");
    }
  }
  std::string note;
  run_on_root(mpi, [&] {
    // A damaged checkpoint is passed over here as resuming passes over it (train/resume.hpp).
    fs::path checkpoint;
    std::string deck;
    for (const fs::path& candidate : candidates) {
      try {
        deck = checkpoint_deck(candidate.string());
        checkpoint = candidate;
        break;
      } catch (const Error&) {
      }
    }
    if (checkpoint.empty()) return;
    const std::vector<KeyChange> changes = changed_training_keys(deck, config);
    std::string refused, keys, accepted_changes;
    for (const KeyChange& change : changes) {
      const std::string text = change.key + " " + change.before + " -> " + change.after;
      const bool type_change = change.key == "optimizer.type";
      if (!type_change && allows(allowed, change.key)) {
        accepted_changes += (accepted_changes.empty() ? "" : ", ") + text;
        continue;
      }
      HPCTRAIN_VERIFY(!type_change, InputError,
                      "cannot resume " << checkpoint.string() << " with another optimizer (" << text
                                       << "): its state vectors are those of " << change.before,
                      "start a new run from its weights instead: hpctrain train DECK --init-from " +
                          checkpoint.string() + " --output NEW_DIR");
      refused += (refused.empty() ? "" : ", ") + text;
      keys += (keys.empty() ? "" : " ") + change.key;
    }
    if (!refused.empty())
      throw InputError("the deck changes optimizer, schedule or loss keys of the run in " + checkpoint.string() +
                           " (resuming would continue it with other settings): " + refused,
                       "resume with the run's own deck (" + run_config.string() +
                           ", raising train.steps is fine), or allow the change: --allow-changed " + keys);
    if (!accepted_changes.empty()) note = "resuming with changed keys (--allow-changed): " + accepted_changes;
  });
  broadcast_string(mpi, note);
  return note;
}

ScheduleStart schedule_start(const CheckpointState& state, std::int64_t total_steps,
                             const ScheduleExtension* extension) {
  ScheduleStart start{state.schedule_origin, ""};
  const std::int64_t before = state.schedule_total_steps;
  const bool extended = before >= 0 && total_steps > before;
  if (extension != nullptr)
    HPCTRAIN_VERIFY(extended, InputError,
                    "--extend: the run is not extended ("
                        << (before < 0 ? "its checkpoint, from an older hpctrain, does not record the run's length"
                                       : "the checkpoint's run has " + std::to_string(before) + " steps, the deck " +
                                             std::to_string(total_steps))
                        << ")",
                    "--extend applies when train.steps (or train.epochs) is raised above the run's length; leave it "
                    "out otherwise");
  if (!extended) return start;
  const bool restart = extension != nullptr && *extension == ScheduleExtension::restart;
  if (restart) start.origin = state.step;
  start.note = "the run is extended from " + std::to_string(before) + " to " + std::to_string(total_steps) +
               " steps: the learning-rate schedule " +
               (restart ? "restarts at step " + std::to_string(state.step) + " (warm-up, then over the " +
                              std::to_string(total_steps - state.step) + " steps added)"
                        : "is stretched to " + std::to_string(total_steps) +
                              " steps (--extend restart would start it again from its warm-up)");
  return start;
}

}  // namespace hpctrain
