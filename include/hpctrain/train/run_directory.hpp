// An output directory and the run in it. hpctrain never overwrites a run: a directory that holds anything hpctrain
// writes (metrics.h5, config.toml, train.log, checkpoints) is a run, and only that run may continue there. Each run
// gets an identity at its first start (a random id stored in metrics.h5 and in every checkpoint), so a checkpoint of
// another run is recognised even when it was copied or the directory was renamed.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace hpctrain {

struct RunDirectory {
  std::filesystem::path path;
  std::vector<std::string> contents;               // what of hpctrain's is there: "metrics.h5", "checkpoints/", ...
  std::string run_id;                              // of the run there; "" when none or unknown (older runs)
  std::vector<std::filesystem::path> checkpoints;  // newest first
  std::int64_t metrics_rows = 0;                   // training steps recorded in metrics.h5

  [[nodiscard]] bool holds_run() const { return !contents.empty(); }
  [[nodiscard]] std::string contents_text() const;  // "metrics.h5, config.toml, checkpoints/ (2 files)"
};

// Reads what `path` holds (rank-local; nothing is created or changed).
RunDirectory inspect_run_directory(const std::filesystem::path& path);

// A new run identity: 16 hex digits from the random device and the clock.
std::string new_run_id();

// How a `train` invocation starts, decided before anything in the output directory is touched.
struct StartPlan {
  std::vector<std::filesystem::path> candidates;  // checkpoints to try, newest first; empty: a fresh start
  std::string run_id;                             // the identity the run continues with (or is given)
  std::string note;                               // for the log: why the start is fresh under --resume auto
};

// resume: "" (fresh), "auto", or what the user named (file, run directory, ...). force: --force. where: the deck
// position of run.output, for messages. Throws InputError when the start would overwrite another run or lose a
// finished one.
StartPlan plan_start(const RunDirectory& output, const std::string& resume, bool force, const std::string& where);

}  // namespace hpctrain
