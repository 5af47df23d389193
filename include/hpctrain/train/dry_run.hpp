// `hpctrain train DECK --dry-run`: everything a run checks before its first step (the deck, the data on every rank,
// the model against the data, the start plan), then the model table, the memory per rank and the plan, printed by
// rank 0. Nothing is trained, and nothing is created or written: not the output directory, not a status file.
#pragma once

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/train/trainer.hpp"

namespace hpctrain {

// Collective. Throws the InputErrors a run would throw for the same deck and data; returns the text rank 0 printed.
std::string dry_run(const RunConfig& config, const MpiEnvironment& mpi, const TrainOptions& options);

}  // namespace hpctrain
