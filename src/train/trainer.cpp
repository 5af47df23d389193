// The training loop. One step:
//   read this rank's rows -> input buffers; forward; loss (gradient pre-scaled by loss_scale / global batch);
//   backward, all-reducing gradient buckets as they complete; gradient statistics (non-finite check on the still
//   scaled, all-reduced gradients, global norm, clip coefficient); fused optimizer update (skipped on non-finite
//   gradients); loss-scaler update; metrics.
#include "hpctrain/train/trainer.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hpctrain/core/error.hpp"
#include "hpctrain/data/batch_loader.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/io/metrics_writer.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/optim/optimizer.hpp"
#include "hpctrain/optim/schedule.hpp"
#include "hpctrain/train/backend_choice.hpp"
#include "hpctrain/train/checkpointing.hpp"
#include "hpctrain/train/device_batch.hpp"
#include "hpctrain/train/evaluation.hpp"
#include "hpctrain/train/phase_timer.hpp"
#include "hpctrain/train/precision_choice.hpp"
#include "hpctrain/train/rank_resources.hpp"
#include "hpctrain/train/run_clock.hpp"
#include "hpctrain/train/run_directory.hpp"
#include "hpctrain/train/run_status.hpp"
#include "hpctrain/train/signals.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

namespace {

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

}  // namespace

// Eager steps before a step is captured into a CUDA graph: they size every scratch buffer and choose every cuBLASLt
// algorithm, so the capture allocates nothing.
constexpr std::int64_t graph_warmup_steps = 3;

class Trainer::Impl {
 public:
  Impl(const RunConfig& config, const MpiEnvironment& mpi, TrainOptions options);
  TrainSummary run();

 private:
  void prepare_output();
  // Resume from the plan's checkpoints, falling back to older ones when the newest is damaged.
  void resume(const StartPlan& plan);
  std::string save_checkpoint(std::int64_t step);
  void log(const std::string& line);
  EvalMetrics evaluate(std::int64_t step);
  [[nodiscard]] std::vector<std::pair<std::string, MetricKind>> eval_columns() const;
  [[nodiscard]] std::vector<double> eval_row(std::int64_t step, const EvalMetrics& metrics) const;
  // A step whose results are not yet on the host (CUDA: read back every few steps) or just arrived (CPU).
  struct PendingStep {
    std::int64_t step = 0, global_rows = 0;
    double start = 0.0, rate = 0.0, loss = 0.0;
    double clock_start = 0.0;  // clock_.now() when the step began
    float scale_in_effect = 1.0f;
    StepScalars scalars;  // after the step
  };
  // What the device records per step for a later read-back (deferred mode).
  struct StepRecord {
    LossSums sums;
    StepScalars before_finish;  // after the optimizer, before the scaler update (loss scale in effect, norm, skip)
    StepScalars after;          // after the scaler update
  };
  // One optimizer step on a batch; appends it to pending_ (with its results on the CPU path).
  void train_step(const HostBatch& batch, std::int64_t step, double step_start, double clock_start);
  // Reads back the pending steps' results (one synchronisation and one MPI_Allreduce for all of them in deferred
  // mode), appends their metrics rows and checks their numerics in order. Returns the seconds per flushed step on
  // clock_ since the first pending step began (0 when nothing was pending).
  double flush_pending();
  // Stop with a clear message when a step went non-finite without a scaler, or the scaler collapsed.
  void check_numerics(const StepScalars& scalars, std::int64_t step, double train_loss) const;

  const RunConfig& config_;
  const MpiEnvironment& mpi_;
  TaskKind task_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<TrainingData> train_data_, validation_data_;
  std::unique_ptr<BatchLoader> loader_;
  std::int64_t local_batch_ = 0, eval_local_batch_ = 0, steps_per_epoch_ = 0, total_steps_ = 0;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<GradientExchange> allreduce_;
  std::unique_ptr<LearningRateSchedule> schedule_;
  LossScalerConfig scaler_;
  BackendBuffer scalars_, sums_, grad_scale_;
  std::unique_ptr<DeviceBatch> device_batch_;
  std::int64_t accumulate_ = 1, micro_batch_ = 0;  // micro-batches per step and their rows per rank
  std::unique_ptr<MetricsWriter> metrics_;
  std::ofstream log_file_;
  std::vector<std::string> early_log_;  // lines logged before train.log is opened (resume), written first
  fs::path output_;
  bool complete_ = false;  // resumed at the deck's last step: nothing to train, nothing to write
  bool resumed_ = false;
  int threads_ = 1;
  float scale_in_effect_ = 1.0f;  // the loss scale the current step runs with (finish_step may change it)
  StepScalars last_scalars_;      // host copy of the scalars after the last step (or as initialised / resumed)
  double last_train_loss_ = 0.0;
  // Deferred read-back (CUDA): steps run without host synchronisation; their loss and scalars are recorded on the
  // device (history_, one StepRecord per step) and read back every train.log_every steps and before anything that
  // needs them (evaluation, checkpoint, stop). The CPU backend reads every step (nothing to gain from deferring).
  bool defer_ = false;
  std::size_t history_capacity_ = 1;
  BackendBuffer history_;
  std::vector<PendingStep> pending_;
  // run.cuda_graphs: the step after warm-up is captured once (graph_ready_) and replayed while batches are full.
  bool graphs_ = false, graph_ready_ = false;
  std::string graphs_note_;  // why graphs are off, for the log
  bool cuda_ = false;
  std::string exchange_name_ = "MPI";  // how gradients are all-reduced (for the log)
  PhaseTimer timer_{false};
  std::int64_t first_step_ = 0;  // 0, or the step a resumed run continues from
  TrainOptions options_;
  std::unique_ptr<CheckpointStore> checkpoints_;
  double control_[3] = {0, 0, 0};  // all-reduced with the loss each step: loss sum, signal, rank 0's stop request
  RunClock clock_;                 // decides checkpoint.every_seconds and train.time_limit (rank 0's)
  double construction_time_ = clock_.now();  // train.time_limit counts from here
  RunStatus fallback_status_{""};            // when options_.status is null
  RunStatus& status_;
  std::vector<std::string> resource_warnings_;  // for the log's head
};

Trainer::Impl::Impl(const RunConfig& config, const MpiEnvironment& mpi, TrainOptions options)
    : config_(config),
      mpi_(mpi),
      task_(task_of(config.model)),
      options_(std::move(options)),
      status_(options_.status != nullptr ? *options_.status : fallback_status_) {
  const int ranks = mpi.size();
  const std::int64_t batch = config.data.batch_size;
  HPCTRAIN_VERIFY(batch % ranks == 0, InputError,
                  config.where("data.batch_size") << ": data.batch_size = " << batch << " is not divisible by the "
                                                  << ranks << " ranks of this run",
                  "data.batch_size is the global batch; pick a multiple of the rank count (e.g. " +
                      std::to_string((batch / ranks + 1) * ranks) + ")");
  local_batch_ = batch / ranks;
  accumulate_ = config.train.accumulate;
  HPCTRAIN_VERIFY(local_batch_ % accumulate_ == 0, InputError,
                  config.where("train.accumulate")
                      << ": train.accumulate = " << accumulate_ << " does not divide the " << local_batch_
                      << " samples per rank (data.batch_size " << batch << " over " << ranks << " ranks)",
                  "data.batch_size must be a multiple of ranks x train.accumulate");
  micro_batch_ = local_batch_ / accumulate_;
  const std::int64_t eval_batch = config.data.eval_batch_size > 0 ? config.data.eval_batch_size : batch;
  eval_local_batch_ = std::max<std::int64_t>(1, (eval_batch + ranks - 1) / ranks);

  // ---- data ----
  train_data_ = std::make_unique<TrainingData>(config, "data.train", config.data.train, task_);
  if (!config.data.validation.empty())
    validation_data_ = std::make_unique<TrainingData>(config, "data.validation", config.data.validation, task_);
  HPCTRAIN_VERIFY(train_data_->samples() >= batch, InputError,
                  config.where("data.batch_size") << ": data.batch_size = " << batch << " but '" << train_data_->file()
                                                  << "' holds only " << train_data_->samples() << " samples",
                  "use a smaller batch or more data: one global batch must fit in the training set");
  if (validation_data_)
    HPCTRAIN_VERIFY(validation_data_->sample_shape() == train_data_->sample_shape(), InputError,
                    config.where("data.validation")
                        << ": validation samples have shape " << shape_text(validation_data_->sample_shape()) << " ("
                        << validation_data_->feature_width() << " features), training samples "
                        << shape_text(train_data_->sample_shape()) << " (" << train_data_->feature_width() << ")");

  // ---- model (validates the layer shapes against the data) ----
  threads_ = choose_thread_count(config, mpi);
  omp_set_num_threads(threads_);
  BackendChoice choice = choose_backend(config, mpi);
  backend_ = std::move(choice.backend);
  cuda_ = choice.cuda;
  resource_warnings_ = rank_resource_warnings(config, mpi, threads_, cuda_);
  const bool shared_device = choice.shared_device;
  // Activations are sized for one micro-batch: that is the memory gradient accumulation saves.
  ModelBuffers buffers{activation_dtype_of(config.precision.mode), DType::f32,
                       std::max(micro_batch_, eval_local_batch_)};
  model_ =
      std::make_unique<Model>(config.model, train_data_->model_input_shape(), *backend_, buffers, config.deck_path);
  if (task_ == TaskKind::regression) {
    HPCTRAIN_VERIFY(model_->output_width() == train_data_->target_width(), InputError,
                    config.where("model.layers")
                        << ": the model has " << model_->output_width() << " outputs but the targets '"
                        << config.data.targets << "' have " << train_data_->target_width() << " columns",
                    "make the last linear layer's 'out' equal to the number of target columns");
  }
  const std::int64_t classes = task_ == TaskKind::classification ? model_->output_width() : 0;
  train_data_->validate(mpi, classes);
  if (validation_data_) validation_data_->validate(mpi, classes);

  // ---- schedule of steps ----
  loader_ = std::make_unique<BatchLoader>(*train_data_, config.data, mpi, local_batch_, config.run.seed);
  steps_per_epoch_ = loader_->steps_per_epoch();
  HPCTRAIN_VERIFY(steps_per_epoch_ > 0, InputError,
                  config.where("data.batch_size")
                      << ": data.batch_size = " << batch << " leaves no full batch per epoch");
  total_steps_ = config.train.steps;
  if (total_steps_ == 0) {
    // Steps key the 32-bit random streams (dropout masks): a run counts at most 2^31 - 1 of them.
    constexpr std::int64_t max_steps = 2147483647;
    const bool overflow = __builtin_mul_overflow(config.train.epochs, steps_per_epoch_, &total_steps_);
    HPCTRAIN_VERIFY(!overflow && total_steps_ <= max_steps, InputError,
                    config.where("train.epochs")
                        << ": train.epochs = " << config.train.epochs << " x " << steps_per_epoch_
                        << " steps per epoch is more than the " << max_steps << " steps a run can take",
                    "use at most " + std::to_string(max_steps / steps_per_epoch_) + " epochs");
  }

  // ---- optimizer, communication, scaler ----
  optimizer_ = std::make_unique<Optimizer>(config.optimizer, *model_, *backend_);
  std::vector<std::int64_t> layer_begins;
  for (std::size_t i = 0; i < model_->layer_count(); ++i) layer_begins.push_back(model_->parameter_begin(i));
  if (cuda_) exchange_name_ = shared_device ? "MPI through host memory (ranks share a GPU)" : "NCCL";
  if (cuda_ && shared_device)  // NCCL refuses two ranks on one GPU: go through the host with MPI
    allreduce_ = std::make_unique<StagedGradientAllreduce>(
        mpi.world(), *backend_, static_cast<float*>(model_->gradients()), model_->parameter_count());
  else if (cuda_)
    allreduce_ = make_nccl_gradient_allreduce(mpi.world(), *backend_, static_cast<float*>(model_->gradients()),
                                              model_->parameter_count(), layer_begins, 25 << 20);
  else
    allreduce_ = std::make_unique<GradientAllreduce>(mpi.world(), static_cast<float*>(model_->gradients()),
                                                     model_->parameter_count(), layer_begins, 25 << 20);
  schedule_ = std::make_unique<LearningRateSchedule>(config.schedule, config.optimizer.lr, total_steps_);
  float initial_scale = 1.0f;
  scaler_ = scaler_config_of(config.precision, &initial_scale);
  scalars_ = BackendBuffer(*backend_, sizeof(StepScalars));
  StepScalars initial;
  initial.loss_scale = initial_scale;
  backend_->copy_to_backend(scalars_.data, &initial, sizeof initial);
  last_scalars_ = initial;
  sums_ = BackendBuffer(*backend_, sizeof(LossSums));
  grad_scale_ = BackendBuffer(*backend_, sizeof(float));
  // HPCTRAIN_DEFERRED_READBACK=1 defers on the CPU backend too: lets machines without a GPU test this path.
  defer_ = cuda_ || std::getenv("HPCTRAIN_DEFERRED_READBACK") != nullptr;
  if (config.run.cuda_graphs) {
    // A replayed graph repeats its launches exactly: only steps that are the same every time can be captured.
    std::string why_not;
    const bool dropout = std::any_of(config.model.layers.begin(), config.model.layers.end(),
                                     [](const LayerSpec& layer) { return layer.type == "dropout" && layer.p > 0.0; });
    if (!cuda_)
      why_not = "the run is not on CUDA";
    else if (accumulate_ > 1)
      why_not = "train.accumulate > 1";
    else if (dropout)
      why_not = "a dropout layer's mask depends on the step";
    else if (shared_device && mpi.size() > 1)
      why_not = "gradients are all-reduced through host memory";
    graphs_ = why_not.empty();
    graphs_note_ = graphs_ ? "run.cuda_graphs: the step is captured after " + std::to_string(graph_warmup_steps) +
                                 " warm-up steps and replayed"
                           : "run.cuda_graphs: off (" + why_not + "); steps run eagerly";
  }
  if (defer_) {
    history_capacity_ = static_cast<std::size_t>(std::clamp<std::int64_t>(config.train.log_every, 1, 1000));
    history_ = BackendBuffer(*backend_, history_capacity_ * sizeof(StepRecord));
  }
  device_batch_ = std::make_unique<DeviceBatch>(*backend_, *model_, task_, buffers.max_rows);
  model_->initialize(config.run.seed);

  output_ = config.run.output;
  // Decided before anything in the output directory is touched: a start never replaces another run's results.
  StartPlan plan;
  run_on_root(mpi, [&] {
    plan = plan_start(inspect_run_directory(output_), options_.resume, options_.force, config.where("run.output"));
  });
  std::string candidates;
  for (const fs::path& candidate : plan.candidates) candidates += candidate.string() + '\n';
  broadcast_string(mpi, plan.run_id);
  broadcast_string(mpi, candidates);
  plan.candidates.clear();
  for (std::stringstream lines(candidates); std::getline(lines, candidates);) plan.candidates.emplace_back(candidates);
  checkpoints_ = std::make_unique<CheckpointStore>(output_ / "checkpoints", mpi, config.checkpoint.keep, plan.run_id);
  if (!plan.note.empty()) log(plan.note);
  resume(plan);
  if (complete_) return;
  prepare_output();
  if (metrics_) metrics_->set_attribute("run_id", plan.run_id);
  set_error_log((output_ / "train.log").string());  // errors from here on reach the log too
  install_checkpoint_signals(config.checkpoint.on_signal);
  // From here the output directory is this run's: its status file says how the run ends.
  if (mpi.is_root()) {
    status_.add_file(output_ / "status");
    status_.write("running", -1, first_step_);
  }
  status_.set_step(first_step_);
}

void Trainer::Impl::resume(const StartPlan& plan) {
  std::vector<std::string> failures;  // damaged checkpoints passed over, newest first
  for (const fs::path& candidate : plan.candidates) {
    CheckpointState state;
    std::string problem;
    bool mismatch = false;
    const double load_start = MPI_Wtime();
    try {
      load_checkpoint(candidate.string(), *model_, *optimizer_, *backend_, state, mpi_);
    } catch (const CheckpointMismatch& error) {
      problem = error.what();
      mismatch = true;
    } catch (const CheckpointDamaged& error) {
      problem = error.what();
    }
    // Every rank reads the same file, so they fail alike; agree anyway so no rank goes on alone.
    int outcome[2] = {problem.empty() ? 0 : 1, mismatch ? 1 : 0};
    HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, outcome, 2, MPI_INT, MPI_MAX, mpi_.world()));
    if (outcome[0] != 0) {
      if (problem.empty()) problem = "checkpoint '" + candidate.string() + "': another rank could not load it";
      if (outcome[1] != 0)  // an older checkpoint of the same run would not fit either
        throw InputError(problem, "resume with the deck the checkpoint was written with (" +
                                      (output_ / "config.toml").string() + ", or the checkpoint's 'deck' attribute)");
      failures.push_back(problem);
      continue;
    }
    for (const std::string& failure : failures) log("warning: " + failure + "; using an older checkpoint");
    HPCTRAIN_VERIFY(
        state.step <= total_steps_, InputError,
        candidate.string() << " is at step " << state.step << ", past this deck's " << total_steps_ << " steps",
        "raise train.steps (or train.epochs) to continue training, or resume with the run's own deck: "
        "hpctrain train " +
            (output_ / "config.toml").string() + " --resume auto");
    first_step_ = state.step;
    resumed_ = true;
    if (state.step == total_steps_) {
      complete_ = true;
      log("the run in '" + output_.string() + "' is already complete at step " + std::to_string(state.step) + " (" +
          candidate.string() + "); nothing to train. Raise train.steps to train further.");
      return;
    }
    state.scalars.found_nonfinite = 0;
    backend_->copy_to_backend(scalars_.data, &state.scalars, sizeof state.scalars);
    last_scalars_ = state.scalars;
    LoaderPosition position{state.epoch, state.step_in_epoch};
    if (position.step_in_epoch >= steps_per_epoch_) position = {position.epoch + 1, 0};  // other rank count
    loader_->seek(position);
    // Continuing from an older checkpoint abandons the newer ones: left behind, a fallback could pick one of them.
    if (options_.resume != "auto" && mpi_.is_root()) {
      if (const std::size_t removed = checkpoints_->discard_after(state.step); removed > 0)
        log("removed " + std::to_string(removed) + " checkpoint" + (removed > 1 ? "s" : "") + " past step " +
            std::to_string(state.step) + " from " + checkpoints_->directory().string() +
            " (the run continues from the older one)");
    }
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3f", MPI_Wtime() - load_start);
    log("resumed from " + candidate.string() + " at step " + std::to_string(state.step) + " (epoch " +
        std::to_string(state.epoch) + "), read in " + seconds + " s");
    return;
  }
  if (plan.candidates.empty()) return;  // a fresh start
  std::string listed;
  for (const std::string& failure : failures) listed += "\n  " + failure;
  throw InputError("no usable checkpoint to resume from:" + listed,
                   "start a fresh run in another directory (--output DIR, without --resume) or point --resume at a "
                   "sound checkpoint");
}

std::string Trainer::Impl::save_checkpoint(std::int64_t step) {
  CheckpointState state;
  backend_->copy_to_host(&state.scalars, scalars_.data, sizeof state.scalars);
  state.step = step;
  state.epoch = loader_->position().epoch;
  state.step_in_epoch = loader_->position().step_in_epoch;
  state.seed = config_.run.seed;
  const double start = MPI_Wtime();
  const std::string path = checkpoints_->save(*model_, *optimizer_, *backend_, state, to_toml(config_));
  char line[512];
  std::snprintf(line, sizeof line, "checkpoint %s written in %.3f s", path.c_str(), MPI_Wtime() - start);
  log(line);
  return path;
}

void Trainer::Impl::prepare_output() {
  run_on_root(mpi_, [&] {
    const std::string where = config_.where("run.output");
    std::error_code error;
    fs::create_directories(output_, error);
    if (error)
      throw InputError(where + ": cannot create output directory '" + output_.string() + "': " + error.message(),
                       "choose a writable location with --output DIR");
    if (access(output_.c_str(), W_OK) != 0)
      throw InputError(where + ": output directory '" + output_.string() + "' is not writable",
                       "choose a writable location with --output DIR");
    std::ofstream deck(output_ / "config.toml");
    deck << to_toml(config_);
    HPCTRAIN_VERIFY(deck.good(), InputError, where << ": cannot write '" << (output_ / "config.toml").string() << "'");
    const bool resumed = resumed_;
    log_file_.open(output_ / "train.log", resumed ? std::ios::app : std::ios::trunc);
    for (const std::string& line : early_log_) log_file_ << line << std::endl;
    early_log_.clear();
    log_file_.flush();
    const std::string metrics_path = (output_ / "metrics.h5").string();
    // A resumed run keeps the rows up to its checkpoint; a fresh start has none to keep.
    metrics_ = resumed ? std::make_unique<MetricsWriter>(metrics_path, first_step_)
                       : std::make_unique<MetricsWriter>(metrics_path);
    metrics_->define("train", {{"step", MetricKind::int64},
                               {"loss", MetricKind::float64},
                               {"lr", MetricKind::float64},
                               {"samples_per_sec", MetricKind::float64},
                               {"grad_norm", MetricKind::float64},
                               {"loss_scale", MetricKind::float64},
                               {"skipped", MetricKind::int64}});
    metrics_->define("eval", eval_columns());
  });
}

void Trainer::Impl::log(const std::string& line) {
  if (!mpi_.is_root()) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (log_file_.is_open())
    log_file_ << line << std::endl;
  else
    early_log_.push_back(line);
}

std::vector<std::pair<std::string, MetricKind>> Trainer::Impl::eval_columns() const {
  std::vector<std::pair<std::string, MetricKind>> columns{{"step", MetricKind::int64}, {"loss", MetricKind::float64}};
  if (task_ == TaskKind::regression) {
    for (const char* name : {"mae", "mse", "r2"}) columns.emplace_back(name, MetricKind::float64);
  } else {
    columns.emplace_back("accuracy", MetricKind::float64);
    if (model_->output_width() > 5) columns.emplace_back("top5_accuracy", MetricKind::float64);
  }
  return columns;
}

std::vector<double> Trainer::Impl::eval_row(std::int64_t step, const EvalMetrics& metrics) const {
  std::vector<double> row{static_cast<double>(step), metrics.loss};
  if (task_ == TaskKind::regression) {
    row.insert(row.end(), {metrics.mae, metrics.mse, metrics.r2});
  } else {
    row.push_back(metrics.accuracy);
    if (model_->output_width() > 5) row.push_back(metrics.top5_accuracy);
  }
  return row;
}

EvalMetrics Trainer::Impl::evaluate(std::int64_t step) {
  const StepContext context{backend_.get(), false, config_.run.seed, static_cast<std::uint32_t>(step), nullptr, 0};
  return evaluate_split(*validation_data_, *model_, *backend_, *device_batch_, task_, eval_local_batch_, context, mpi_);
}

void Trainer::Impl::train_step(const HostBatch& batch, std::int64_t step, double step_start, double clock_start) {
  const std::int64_t global_rows = batch.rows * mpi_.size();
  const auto learning_rate = static_cast<float>(schedule_->at(step));
  backend_->copy_to_backend(scalars_.as<char>() + offsetof(StepScalars, learning_rate), &learning_rate,
                            sizeof learning_rate);
  // d(mean loss over the global batch)/d(output), times the loss scale (fixed for the whole step); the all-reduce
  // then sums the ranks' parts. Formed by the backend from its own copy of the scalars: no host round trip.
  scale_in_effect_ = last_scalars_.loss_scale;

  // Micro-batches accumulate into the gradient buffer; only the last one's backward all-reduces (no communication
  // for the others). With run.cuda_graphs, a step of one full micro-batch is captured once after warm-up (everything
  // from the loss scale to the optimizer; the uploads stay outside) and replayed from then on.
  const std::int64_t micro_batches = (batch.rows + micro_batch_ - 1) / micro_batch_;
  const bool graph_step = graphs_ && micro_batches == 1 && batch.rows == micro_batch_;
  bool replayed = false, capturing = false;
  for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
    const std::int64_t first = micro * micro_batch_;
    const std::int64_t rows = std::min(micro_batch_, batch.rows - first);
    const bool last_micro = micro + 1 == micro_batches;
    timer_.begin(Phase::forward);
    device_batch_->upload(batch, first, rows, *model_);
    if (micro == 0) {
      if (graph_step && graph_ready_) {
        backend_->replay_capture();
        replayed = true;
        break;
      }
      capturing = graph_step && step >= first_step_ + graph_warmup_steps;
      if (capturing) backend_->begin_capture();
      backend_->loss_gradient_scale(scalars_.as<StepScalars>(), static_cast<float>(global_rows),
                                    grad_scale_.as<float>());
      backend_->zero(sums_.data, sizeof(LossSums));
    }
    const StepContext context{
        backend_.get(), true, config_.run.seed, static_cast<std::uint32_t>(step), device_batch_->sample_ids(), rows};
    const TensorView output = model_->forward(context);
    device_batch_->loss(output, grad_scale_.as<float>(), sums_.as<LossSums>());
    timer_.begin(Phase::backward);
    if (last_micro) {
      allreduce_->begin_step();
      model_->backward(context, micro > 0, [&](std::int64_t begin) { allreduce_->ready_from(begin); });
    } else {
      model_->backward(context, micro > 0, nullptr);
    }
  }
  if (!replayed) {
    timer_.begin(Phase::allreduce);
    allreduce_->finish();
    timer_.begin(Phase::optimizer);
    optimizer_->gradient_statistics(scalars_.as<StepScalars>());
    optimizer_->step(scalars_.as<StepScalars>());
    if (capturing) {  // captured, not run: run it now
      backend_->end_capture();
      backend_->replay_capture();
      graph_ready_ = true;
    }
  }
  timer_.begin(Phase::optimizer);
  PendingStep pending;
  pending.step = step;
  pending.global_rows = global_rows;
  pending.start = step_start;
  pending.clock_start = clock_start;
  if (defer_) {
    // Recorded on the device; read back by flush_pending. The records of a window start at slot 0.
    char* record = history_.as<char>() + pending_.size() * sizeof(StepRecord);
    backend_->copy(record + offsetof(StepRecord, sums), sums_.data, sizeof(LossSums));
    backend_->copy(record + offsetof(StepRecord, before_finish), scalars_.data, sizeof(StepScalars));
    backend_->finish_step(scaler_, scalars_.as<StepScalars>());
    backend_->copy(record + offsetof(StepRecord, after), scalars_.data, sizeof(StepScalars));
    control_[0] = 0.0;  // the loss sums travel with the read-back
  } else {
    backend_->finish_step(scaler_, scalars_.as<StepScalars>());
    LossSums sums;
    backend_->copy_to_host(&pending.scalars, scalars_.data, sizeof pending.scalars);
    backend_->copy_to_host(&sums, sums_.data, sizeof sums);
    last_scalars_ = pending.scalars;
    pending.scale_in_effect = scale_in_effect_;
    control_[0] = sums.loss_sum;
  }
  // One small reduction per step carries the loss (CPU) and the stop requests (a signal on any rank, rank 0's clock).
  control_[1] = pending_checkpoint_signal();
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, control_, 3, MPI_DOUBLE, MPI_SUM, mpi_.world()));
  timer_.end();
  pending.loss = control_[0] / static_cast<double>(global_rows);
  pending.rate = static_cast<double>(global_rows) / std::max(MPI_Wtime() - step_start, 1e-9);
  pending_.push_back(pending);
}

double Trainer::Impl::flush_pending() {
  if (pending_.empty()) return 0.0;
  const std::size_t count = pending_.size();
  if (defer_) {
    std::vector<StepRecord> records(count);
    backend_->copy_to_host(records.data(), history_.data, count * sizeof(StepRecord));
    std::vector<double> losses(count);
    for (std::size_t i = 0; i < count; ++i) losses[i] = records[i].sums.loss_sum;
    HPCTRAIN_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, losses.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM, mpi_.world()));
    std::int64_t rows = 0;
    for (const PendingStep& pending : pending_) rows += pending.global_rows;
    // Steps ran asynchronously: one rate for the window is all that can be measured.
    const double window_rate = static_cast<double>(rows) / std::max(MPI_Wtime() - pending_.front().start, 1e-9);
    for (std::size_t i = 0; i < count; ++i) {
      PendingStep& pending = pending_[i];
      pending.loss = losses[i] / static_cast<double>(pending.global_rows);
      pending.scalars = records[i].after;
      pending.scalars.found_nonfinite = records[i].before_finish.found_nonfinite;
      pending.scale_in_effect = records[i].before_finish.loss_scale;
      pending.rate = window_rate;
    }
    last_scalars_ = pending_.back().scalars;
  }
  const double seconds_per_step = (clock_.now() - pending_.front().clock_start) / static_cast<double>(count);
  for (const PendingStep& pending : pending_) {
    last_train_loss_ = pending.loss;
    if (metrics_)
      metrics_->append("train", {static_cast<double>(pending.step + 1), pending.loss, schedule_->at(pending.step),
                                 pending.rate, pending.scalars.grad_norm, pending.scale_in_effect,
                                 pending.scalars.found_nonfinite != 0 ? 1.0 : 0.0});
    check_numerics(pending.scalars, pending.step, pending.loss);
  }
  pending_.clear();
  return seconds_per_step;
}

void Trainer::Impl::check_numerics(const StepScalars& scalars, std::int64_t step, double train_loss) const {
  if (scalars.found_nonfinite && !scaler_.enabled)
    throw NumericsError("the loss or the gradients became NaN/Inf at step " + std::to_string(step + 1) + " (" +
                            config_.precision.mode + ", loss " + number_text(train_loss) +
                            "); the run stopped before applying them (metrics.h5 keeps the steps so far)",
                        "lower optimizer.lr, set optimizer.grad_clip, or check the data for extreme values");
  if (scaler_.enabled && scalars.consecutive_skips > config_.precision.max_skipped_steps)
    throw NumericsError("the loss scale collapsed: " + std::to_string(scalars.consecutive_skips) +
                            " steps in a row had non-finite gradients (last at step " + std::to_string(step + 1) +
                            ", scale now " + number_text(scalars.loss_scale) + ")",
                        "the model diverged; lower optimizer.lr or try precision.mode = \"bf16\"");
}

TrainSummary Trainer::Impl::run() {
  TrainSummary summary;
  summary.output_directory = output_.string();
  if (complete_) {  // OUTPUT/status already says so; a --status-file copy hears it again
    summary.already_complete = true;
    summary.steps = first_step_;
    if (mpi_.is_root()) status_.write("complete", 0, first_step_);
    return summary;
  }
  const int ranks = mpi_.size();
  timer_ = PhaseTimer(config_.train.profile);
  if (mpi_.is_root()) {
    std::ostringstream head;
    head << "hpctrain " << HPCTRAIN_VERSION << ": " << ranks << " rank" << (ranks > 1 ? "s" : "") << " x " << threads_
         << " thread" << (threads_ > 1 ? "s" : "") << ", backend " << backend_->name() << ", precision "
         << config_.precision.mode << (scaler_.enabled ? " with loss scaling" : "")
         << (ranks > 1 ? ", gradients all-reduced with " + exchange_name_ : std::string()) << "\n"
         << (graphs_note_.empty() ? std::string() : graphs_note_ + "\n") << "data: " << train_data_->samples()
         << " training samples"
         << (validation_data_ ? ", " + std::to_string(validation_data_->samples()) + " validation samples" : "")
         << ", global batch " << config_.data.batch_size << " (" << local_batch_ << " per rank), " << steps_per_epoch_
         << " steps per epoch, " << total_steps_ << " steps\n"
         << "model:\n"
         << model_->summary();
    log(head.str());
    for (const std::string& warning : resource_warnings_) log(warning);
  }

  const double start = MPI_Wtime();
  double interval_start = start, last_eval_accuracy = -1.0, last_eval_loss = 0.0, last_train_loss = 0.0;
  std::int64_t interval_samples = 0, evaluations = 0;
  std::vector<double> interval_rates;
  std::int64_t step = first_step_;
  const double time_limit = parse_time_limit(config_.train.time_limit);
  double last_checkpoint_time = clock_.now(), recent_step = 0.0, longest_checkpoint = 1.0;
  while (step < total_steps_) {
    const double step_start = MPI_Wtime(), decided_at = clock_.now();
    // Rank 0's clock decides time-based checkpoints (1: checkpoint, 2: checkpoint and stop); the step's reduction
    // tells every rank.
    control_[2] = 0.0;
    if (mpi_.is_root()) {
      if (config_.checkpoint.every_seconds > 0 && decided_at - last_checkpoint_time >= config_.checkpoint.every_seconds)
        control_[2] = 1.0;
      if (time_limit > 0 && decided_at - construction_time_ + 3 * recent_step + 2 * longest_checkpoint >= time_limit)
        control_[2] = 2.0;
    }
    const std::int64_t epoch = loader_->position().epoch;
    timer_.begin(Phase::data);
    const HostBatch& batch = loader_->next();
    train_step(batch, step, step_start, decided_at);
    clock_.step_finished();
    const double after_step = MPI_Wtime();
    interval_samples += batch.rows * ranks;
    ++step;
    const bool last = step == total_steps_;
    const bool log_now = step % config_.train.log_every == 0 || last;
    const bool evaluate_now =
        validation_data_ && (last || (config_.train.eval_every > 0 && step % config_.train.eval_every == 0));
    const bool signalled = control_[1] > 0, out_of_time = control_[2] > 1.5;
    const bool periodic =
        (config_.checkpoint.every_steps > 0 && step % config_.checkpoint.every_steps == 0) || control_[2] > 0.5;
    const bool checkpoint_now = periodic || signalled || out_of_time || (last && config_.checkpoint.at_end);
    // Results reach the host here: every step on the CPU, at these points (or when the record buffer is full) on CUDA.
    if (!defer_ || log_now || evaluate_now || checkpoint_now || pending_.size() >= history_capacity_) {
      // A moving average of the step time: one slow step (start-up, a busy node) must not stop the run early.
      const double step_seconds = flush_pending();
      recent_step = recent_step > 0.0 ? 0.9 * recent_step + 0.1 * step_seconds : step_seconds;
    }
    const double train_loss = last_train_loss_;
    const StepScalars& scalars = last_scalars_;
    last_train_loss = train_loss;
    // Deferred steps ran asynchronously: the interval ends when their results arrived.
    const double now = defer_ ? MPI_Wtime() : after_step;

    if (log_now) {
      const double interval_rate = static_cast<double>(interval_samples) / std::max(now - interval_start, 1e-9);
      if (step > first_step_ + 1 || last) interval_rates.push_back(interval_rate);
      interval_start = now;
      interval_samples = 0;
      const double eta =
          (now - start) / static_cast<double>(step - first_step_) * static_cast<double>(total_steps_ - step);
      char line[256];
      std::snprintf(line, sizeof line, "step %6lld/%lld  epoch %lld  loss %.5f  lr %.3e  %9.0f samples/s%s  ETA %s",
                    static_cast<long long>(step), static_cast<long long>(total_steps_), static_cast<long long>(epoch),
                    train_loss, schedule_->at(step - 1), interval_rate,
                    scaler_.enabled ? ("  scale " + number_text(scalars.loss_scale)).c_str() : "",
                    format_duration(eta).c_str());
      log(line);
    }
    if (evaluate_now) {
      timer_.begin(Phase::evaluation);
      const EvalMetrics metrics = evaluate(step);
      timer_.end();
      last_eval_loss = metrics.loss;
      last_eval_accuracy = std::isnan(metrics.accuracy) ? -1.0 : metrics.accuracy;
      ++evaluations;
      if (metrics_) metrics_->append("eval", eval_row(step, metrics));
      log("eval at step " + std::to_string(step) + ": " + describe(metrics));
    }

    status_.set_step(step);
    if (checkpoint_now) {
      const double checkpoint_start = clock_.now();
      save_checkpoint(step);
      last_checkpoint_time = clock_.now();
      longest_checkpoint = std::max(longest_checkpoint, last_checkpoint_time - checkpoint_start);
    }
    if (signalled || out_of_time) {
      const int local = pending_checkpoint_signal();
      log(std::string("stopping at step ") + std::to_string(step) + " after " +
          (out_of_time ? "nearing train.time_limit (" + config_.train.time_limit + ")"
                       : (local ? signal_name(local) : std::string("a signal on another rank"))) +
          "; the checkpoint is committed. Exit status " + std::to_string(exit_checkpointed) +
          ": continue with --resume auto");
      summary.exit_code = exit_checkpointed;
      break;
    }
  }
  summary.steps = step;
  summary.seconds = MPI_Wtime() - start;
  summary.final_train_loss = last_train_loss;
  summary.final_eval_loss = last_eval_loss;
  summary.final_eval_accuracy = last_eval_accuracy;
  summary.samples_per_second = median(interval_rates);
  // Only figures this invocation measured: a run stopped before its first evaluation has no validation figure.
  std::ostringstream done;
  done << (summary.exit_code == exit_checkpointed ? "stopped: " : "done: ") << step << " steps (" << step - first_step_
       << " in this run) in " << format_duration(summary.seconds);
  if (step > first_step_) done << "; final train loss " << number_text(last_train_loss);
  if (evaluations > 0)
    done << (task_ == TaskKind::classification ? ", validation accuracy " + number_text(last_eval_accuracy)
                                               : ", validation mse " + number_text(last_eval_loss));
  if (!interval_rates.empty())
    done << ", " << static_cast<long long>(summary.samples_per_second) << " samples/s (median)";
  done << "\n"
       << "outputs: " << (output_ / "metrics.h5").string() << ", " << (output_ / "config.toml").string() << ", "
       << (output_ / "train.log").string() << ", " << checkpoints_->directory().string() << "/";
  log(done.str());
  if (timer_.enabled()) log(timer_.report(step - first_step_));
  if (mpi_.is_root())
    status_.write(summary.exit_code == exit_checkpointed ? "checkpointed" : "complete", summary.exit_code, step);
  return summary;
}

Trainer::Trainer(const RunConfig& config, const MpiEnvironment& mpi, const TrainOptions& options)
    : impl_(std::make_unique<Impl>(config, mpi, options)) {}
Trainer::~Trainer() = default;
TrainSummary Trainer::run() { return impl_->run(); }

}  // namespace hpctrain
