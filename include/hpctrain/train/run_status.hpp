// How `hpctrain train` ended, as one line in OUTPUT/status (and in the file `train --status-file FILE` names), for job
// scripts: a launcher's exit status is not enough (mpiexec that got a signal exits 1 after hpctrain's 75), and a rank
// killed outright leaves no status at all. The lines (docs/checkpoints.md):
//   running - step N          training since step N, or killed without the chance to write more
//   complete 0 step N         finished all N steps
//   checkpointed 75 step N    stopped on a signal or train.time_limit with a committed checkpoint at step N
//   failed E step N           stopped by an error with exit status E (2: input, 1: runtime) after step N
// Each write replaces the file atomically (a temporary file renamed over it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace hpctrain {

class RunStatus {
 public:
  // status_file: --status-file ("" for none). OUTPUT/status is added by the trainer once the output directory is its.
  explicit RunStatus(const std::string& status_file);
  void add_file(const std::filesystem::path& path) { files_.push_back(path); }
  // The last step completed, for a later failure line (no file is written).
  void set_step(std::int64_t step) { step_ = step; }
  // Writes the line to every file. A file that cannot be written gets a warning on stderr, never an exception: the
  // status must not end a run, nor hide the error being reported.
  void write(const std::string& state, int exit_code, std::int64_t step);
  // "failed E step N" with the last step set_step or write recorded.
  void write_failure(int exit_code) { write("failed", exit_code, step_); }

 private:
  std::vector<std::filesystem::path> files_;
  std::int64_t step_ = 0;
};

}  // namespace hpctrain
