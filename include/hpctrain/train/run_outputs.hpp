// The files of a run in its output directory, and its log: config.toml (the resolved deck), train.log (everything the
// run printed, errors included), metrics.h5 (the training and evaluation tables, tagged with the run's identity) and
// status (how the run ended, for job scripts). Nothing is written before open(): a start refused while planning or
// resuming leaves the directory as it was; lines logged before then are kept and written to train.log first.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/metrics_writer.hpp"
#include "hpctrain/train/run_status.hpp"

namespace hpctrain {

class RunOutputs {
 public:
  RunOutputs(const RunConfig& config, const MpiEnvironment& mpi, RunStatus& status);

  // Rank 0 prints the line and appends it to train.log (kept for later before open()).
  void log(const std::string& line);

  // Creates the directory and the files (collective; rank 0 writes; an error ends every rank). resumed_at: the step a
  // resumed run continues from (metrics rows past it are dropped), or -1 for a fresh run.
  void open(std::int64_t resumed_at, const std::string& run_id,
            const std::vector<std::pair<std::string, MetricKind>>& eval_columns);

  // metrics.h5 on rank 0 after open(), else null.
  [[nodiscard]] MetricsWriter* metrics() const { return metrics_.get(); }
  [[nodiscard]] const std::filesystem::path& directory() const { return directory_; }

 private:
  const RunConfig& config_;
  const MpiEnvironment& mpi_;
  RunStatus& status_;
  std::filesystem::path directory_;
  std::ofstream log_file_;
  std::vector<std::string> early_log_;
  std::unique_ptr<MetricsWriter> metrics_;
};

}  // namespace hpctrain
