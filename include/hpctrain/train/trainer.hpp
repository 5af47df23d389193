// The trainer: sets up data, model, optimizer and outputs from a validated deck, then runs the training loop
// (forward, loss, backward with overlapped gradient all-reduce, loss scaling, fused optimizer), evaluation, logging and
// metrics.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

class RunStatus;

// How a run starts: fresh, or from a checkpoint; where it reports how it ended.
struct TrainOptions {
  std::string resume;           // "": fresh; "auto": OUTPUT/checkpoints/latest, or fresh in an empty directory; else a
                                // checkpoint file or run directory
  bool force = false;           // --force: continue a named checkpoint in a directory that holds another run
  RunStatus* status = nullptr;  // also writes OUTPUT/status; the caller writes failures (null: OUTPUT/status only)
  std::string init_from;        // --init-from: a fresh start takes the parameters of this checkpoint
  std::vector<std::string> allow_changed;  // --allow-changed: optimizer/schedule/loss keys a resume may change
  std::string extend;                      // --extend stretch|restart ("" = not given: stretch)
};

struct TrainSummary {
  int exit_code = 0;  // 0, or exit_checkpointed after a signal / the time limit
};

class Trainer {
 public:
  Trainer(const RunConfig& config, const MpiEnvironment& mpi, const TrainOptions& options = {});
  ~Trainer();
  TrainSummary run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpctrain
