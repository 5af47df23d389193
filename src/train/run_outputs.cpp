// The run's output directory: created once the start is decided, then appended to.
#include "hpctrain/train/run_outputs.hpp"

#include <unistd.h>

#include <cstdio>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

RunOutputs::RunOutputs(const RunConfig& config, const MpiEnvironment& mpi, RunStatus& status)
    : config_(config), mpi_(mpi), status_(status), directory_(config.run.output) {}

void RunOutputs::log(const std::string& line) {
  if (!mpi_.is_root()) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (log_file_.is_open())
    log_file_ << line << std::endl;
  else
    early_log_.push_back(line);
}

void RunOutputs::open(std::int64_t resumed_at, const std::string& run_id,
                      const std::vector<std::pair<std::string, MetricKind>>& eval_columns) {
  run_on_root(mpi_, [&] {
    const std::string where = config_.where("run.output");
    std::error_code error;
    fs::create_directories(directory_, error);
    if (error)
      throw InputError(where + ": cannot create output directory '" + directory_.string() + "': " + error.message(),
                       "choose a writable location with --output DIR");
    if (access(directory_.c_str(), W_OK) != 0)
      throw InputError(where + ": output directory '" + directory_.string() + "' is not writable",
                       "choose a writable location with --output DIR");
    // Replaced whole (a resume compares its deck with this file): never left half-written by a crash or a full disk.
    write_text_file_atomically(directory_ / "config.toml", to_toml(config_));
    const bool resumed = resumed_at >= 0;
    log_file_.open(directory_ / "train.log", resumed ? std::ios::app : std::ios::trunc);
    for (const std::string& line : early_log_) log_file_ << line << '\n';
    early_log_.clear();
    log_file_.flush();
    const std::string metrics_path = (directory_ / "metrics.h5").string();
    // A resumed run keeps the rows up to its checkpoint; a fresh start has none to keep.
    metrics_ = resumed ? std::make_unique<MetricsWriter>(metrics_path, resumed_at)
                       : std::make_unique<MetricsWriter>(metrics_path);
    metrics_->define("train", {{"step", MetricKind::int64},
                               {"loss", MetricKind::float64},
                               {"lr", MetricKind::float64},
                               {"samples_per_sec", MetricKind::float64},
                               {"grad_norm", MetricKind::float64},
                               {"loss_scale", MetricKind::float64},
                               {"skipped", MetricKind::int64}});
    metrics_->define("eval", eval_columns);
    metrics_->set_attribute("run_id", run_id);
    status_.add_file(directory_ / "status");
    status_.write("running", -1, std::max<std::int64_t>(resumed_at, 0));
  });
  set_error_log((directory_ / "train.log").string());  // errors from here on reach the log too
}

}  // namespace hpctrain
