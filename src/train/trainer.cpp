// The trainer: sets a run up from the deck (data, backend, model, optimizer, gradient exchange, loss scaler), decides
// how it starts (train/resume.hpp), then loops over steps (train/training_step.hpp), reading their results back
// (train/step_records.hpp), logging, evaluating, checkpointing, and stopping on a signal or the time limit
// (train/run_control.hpp) with the run's files kept by train/run_outputs.hpp.
#include "hpctrain/train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/data/batch_loader.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/io/metrics_writer.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/optim/optimizer.hpp"
#include "hpctrain/optim/schedule.hpp"
#include "hpctrain/precision/loss_scaler.hpp"
#include "hpctrain/precision/policy.hpp"
#include "hpctrain/train/backend_choice.hpp"
#include "hpctrain/train/best_checkpoint.hpp"
#include "hpctrain/train/checkpointing.hpp"
#include "hpctrain/train/device_batch.hpp"
#include "hpctrain/train/evaluation.hpp"
#include "hpctrain/train/phase_timer.hpp"
#include "hpctrain/train/rank_resources.hpp"
#include "hpctrain/train/resume.hpp"
#include "hpctrain/train/run_clock.hpp"
#include "hpctrain/train/run_continuation.hpp"
#include "hpctrain/train/run_control.hpp"
#include "hpctrain/train/run_outputs.hpp"
#include "hpctrain/train/run_schedule.hpp"
#include "hpctrain/train/run_shape.hpp"
#include "hpctrain/train/signals.hpp"
#include "hpctrain/train/step_records.hpp"
#include "hpctrain/train/training_step.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

class Trainer::Impl {
 public:
  Impl(const RunConfig& config, const MpiEnvironment& mpi, TrainOptions options);
  ~Impl();
  TrainSummary run();

 private:
  void set_up_data();
  void set_up_model();
  void set_up_step();
  // Plan the start, resume if the plan says so, and open the output directory (unless the run is already complete).
  void start();
  // Resumed: where the learning-rate schedule starts (an extended run's --extend). Fresh: --init-from's parameters.
  void start_schedule(const CheckpointState& state);
  void start_weights(bool resumed);
  void log(const std::string& line) { outputs_.log(line); }
  [[nodiscard]] std::string head() const;
  // The recorded steps' results to the host: metrics rows, the divergence check. Returns seconds per step.
  double flush_steps();
  // best: the checkpoint becomes checkpoints/best.
  void save_checkpoint(std::int64_t step, bool best = false);
  // "stopping at step N after SIGTERM / nearing train.time_limit ..." (the checkpoint is already committed).
  void log_stop(std::int64_t step, bool out_of_time);
  EvalMetrics evaluate(std::int64_t step);
  // checkpoint.best_metric: the evaluation after `step` seen by the tracker (rank 0's decision, agreed), its log note
  // and metrics.h5's attributes.
  Observation watch_best(std::int64_t step, const EvalMetrics& metrics, std::string& note);
  // A resumed run whose patience was already exhausted: says so. Returns whether training is over.
  bool stopped_early_before();

  const RunConfig& config_;
  const MpiEnvironment& mpi_;
  TrainOptions options_;
  RunStatus fallback_status_{""};  // when options_.status is null
  RunStatus& status_;
  TaskKind task_;
  PrecisionPolicy precision_;
  RunOutputs outputs_;
  RunClock clock_;                           // decides checkpoint.every_seconds and train.time_limit (rank 0's)
  double construction_time_ = clock_.now();  // train.time_limit counts from here
  PhaseTimer timer_;
  const bool watch_best_;  // checkpoint.best_metric is set
  BestTracker best_;       // the best checkpoint and early stopping (restored on resume)

  // set-up
  std::unique_ptr<Backend> backend_;
  int threads_ = 1;
  bool cuda_ = false, shared_device_ = false;
  std::vector<std::string> resource_warnings_;  // for the log's head
  std::unique_ptr<TrainingData> train_data_, validation_data_;
  std::unique_ptr<BatchLoader> loader_;
  std::int64_t local_batch_ = 0, eval_local_batch_ = 0, micro_rows_ = 0, steps_per_epoch_ = 0, total_steps_ = 0;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<GradientExchange> exchange_;
  std::string exchange_name_ = "MPI";  // how gradients are all-reduced (for the log)
  std::unique_ptr<LearningRateSchedule> schedule_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<DeviceBatch> device_batch_;
  std::unique_ptr<TrainingStep> step_;
  std::unique_ptr<StepGraph> graph_;
  bool graphs_ = false;      // run.cuda_graphs, and the run allows it
  std::string graphs_note_;  // run.cuda_graphs: whether steps are captured, for the log
  std::unique_ptr<StepRecords> records_;
  std::unique_ptr<RunSchedule> run_schedule_;  // evaluation and checkpoint intervals, rank 0's clock decisions
  bool defer_ = false;  // results read back at log/eval/checkpoint points only (CUDA), not after every step

  // start and progress
  std::unique_ptr<CheckpointStore> checkpoints_;
  std::int64_t first_step_ = 0;       // 0, or the step a resumed run continues from
  std::int64_t schedule_origin_ = 0;  // the step the learning-rate schedule starts from (train/run_continuation.hpp)
  bool complete_ = false;             // resumed at the deck's last step: nothing to train, nothing to write
  double last_train_loss_ = 0.0;
  double interval_loss_sum_ = 0.0;  // training losses of the steps flushed since the last log line
  std::int64_t interval_steps_ = 0;
  std::vector<double> step_rates_;  // samples/s of this invocation's steps, as metrics.h5 records them
  StepScalars last_scalars_;        // host copy after the last flushed step (or as initialised / resumed)
};

Trainer::Impl::Impl(const RunConfig& config, const MpiEnvironment& mpi, TrainOptions options)
    : config_(config),
      mpi_(mpi),
      options_(std::move(options)),
      status_(options_.status != nullptr ? *options_.status : fallback_status_),
      task_(task_of(config.model.loss)),
      precision_(PrecisionPolicy::of(config.precision.mode)),
      outputs_(config, mpi, status_),
      timer_(config.train.profile),
      watch_best_(config.checkpoint.best_metric != BestMetric::none),
      best_(tracker_for(config)) {
  set_up_data();
  set_up_model();
  set_up_step();
  start();
}

void Trainer::Impl::set_up_data() {
  const RunConfig& config = config_;
  const BatchShape shape = batch_shape(config, mpi_.size());
  local_batch_ = shape.local_batch;
  micro_rows_ = shape.micro_rows;
  eval_local_batch_ = shape.eval_local_batch;
  train_data_ = std::make_unique<TrainingData>(config, "data.train", config.data.train, task_);
  train_data_->set_up_augmentation(config);
  if (!config.data.validation.empty())
    validation_data_ = std::make_unique<TrainingData>(config, "data.validation", config.data.validation, task_);
  check_data_fits(config, *train_data_, validation_data_.get());
}

void Trainer::Impl::set_up_model() {
  const RunConfig& config = config_;
  threads_ = choose_thread_count(config, mpi_);
  omp_set_num_threads(threads_);
  BackendChoice choice = choose_backend(config, mpi_);
  backend_ = std::move(choice.backend);
  timer_ = PhaseTimer(config.train.profile, backend_.get());  // CUDA: device time from events
  cuda_ = choice.cuda;
  shared_device_ = choice.shared_device;
  resource_warnings_ = rank_resource_warnings(config, mpi_, threads_, cuda_);
  if (!choice.note.empty()) resource_warnings_.insert(resource_warnings_.begin(), choice.note);
  if (std::string hint = channels_last_hint(*train_data_, config.data.features); !hint.empty())
    resource_warnings_.push_back(std::move(hint));
  // Activations are sized for one micro-batch: that is the memory gradient accumulation saves.
  const ModelBuffers buffers{precision_.activations, precision_.master, std::max(micro_rows_, eval_local_batch_)};
  model_ =
      std::make_unique<Model>(config.model, train_data_->model_input_shape(), *backend_, buffers, config.deck_path);
  check_model_fits_data(config, *model_, *train_data_, validation_data_.get(), mpi_);
  if (watch_best_) check_best_metric_computed(config, task_, model_->classes());
  device_batch_ = std::make_unique<DeviceBatch>(*backend_, *model_, buffers.max_rows);
  model_->initialize(config.run.seed);
}

void Trainer::Impl::set_up_step() {
  const RunConfig& config = config_;
  loader_ = std::make_unique<BatchLoader>(*train_data_, config.data, mpi_, local_batch_, config.run.seed);
  steps_per_epoch_ = loader_->steps_per_epoch();
  total_steps_ = total_steps_of(config, steps_per_epoch_);
  run_schedule_ = std::make_unique<RunSchedule>(config, steps_per_epoch_);

  optimizer_ = std::make_unique<Optimizer>(config.optimizer, *model_, *backend_);
  std::vector<std::int64_t> layer_begins;
  for (std::size_t i = 0; i < model_->layer_count(); ++i) layer_begins.push_back(model_->parameter_begin(i));
  auto* gradients = static_cast<float*>(model_->gradients());
  if (cuda_) exchange_name_ = shared_device_ ? "MPI through host memory (ranks share a GPU)" : "NCCL";
  if (cuda_ && shared_device_)  // NCCL refuses two ranks on one GPU: go through the host with MPI
    exchange_ =
        std::make_unique<StagedGradientAllreduce>(mpi_.world(), *backend_, gradients, model_->parameter_count());
  else if (cuda_)
    exchange_ = make_nccl_gradient_allreduce(mpi_.world(), *backend_, gradients, model_->parameter_count(),
                                             layer_begins, 25 << 20);
  else {
    const MpiExchangeSettings settings = mpi_exchange_settings(mpi_.serialized());
    exchange_name_ = settings.algorithm == MpiAllreduce::library ? "MPI_Iallreduce"
                     : settings.optimizer == MpiOptimizer::sharded
                         ? "MPI (rank-order reduce-scatter; each rank updates its slice, then all-gather)"
                         : "MPI (rank-order reduce-scatter + all-gather)";
    exchange_ = std::make_unique<GradientAllreduce>(mpi_.world(), gradients, model_->parameter_count(), layer_begins,
                                                    mpi_bucket_bytes(model_->parameter_count()), settings);
  }
  schedule_ = std::make_unique<LearningRateSchedule>(config.schedule, config.optimizer.lr, total_steps_);
  scaler_ = std::make_unique<LossScaler>(config.precision, *backend_);
  last_scalars_ = scaler_->read();

  // A replayed graph repeats its launches exactly: only steps that are the same every time can be captured.
  std::string why_not;
  // Dropout layers, the attention's dropout on its probabilities and a transformer_block's (both kinds).
  const auto drops = [](const LayerSpec& layer) {
    return (layer.type == LayerType::dropout && layer.p > 0) || layer.dropout > 0 || layer.residual_dropout > 0;
  };
  const bool dropout = std::any_of(config.model.layers.begin(), config.model.layers.end(), [&](const LayerSpec& layer) {
    return drops(layer) || std::any_of(layer.layers.begin(), layer.layers.end(), drops);  // a residual's branch
  });
  if (!cuda_)
    why_not = "the run is not on CUDA";
  else if (config.train.accumulate > 1)
    why_not = "train.accumulate > 1";
  else if (dropout)
    why_not = "a dropout mask depends on the step";
  else if (shared_device_ && mpi_.size() > 1)
    why_not = "gradients are all-reduced through host memory";
  graphs_ = config.run.cuda_graphs && why_not.empty();
  if (config.run.cuda_graphs)
    graphs_note_ = graphs_ ? "run.cuda_graphs: the step is captured after " + std::to_string(graph_warmup_steps) +
                                 " warm-up steps and replayed"
                           : "run.cuda_graphs: off (" + why_not + "); steps run eagerly";
  step_ = std::make_unique<TrainingStep>(*backend_, *model_, *optimizer_, *exchange_, *scaler_, *device_batch_,
                                         micro_rows_, mpi_.world(), config.run.seed, timer_);
  // HPCTRAIN_DEFERRED_READBACK=1 defers on the CPU backend too: lets machines without a GPU test this path.
  defer_ = cuda_ || std::getenv("HPCTRAIN_DEFERRED_READBACK") != nullptr;
  records_ = std::make_unique<StepRecords>(
      *backend_, defer_ ? static_cast<std::size_t>(std::clamp<std::int64_t>(config.train.log_every, 1, 1000)) : 1);
  // graph_ is made once the first step is known (start()).
}

void Trainer::Impl::start() {
  // Decided before anything in the output directory is touched: a start never replaces another run's results.
  const StartPlan plan = agree_start_plan(config_, mpi_, options_.resume, options_.force);
  checkpoints_ = std::make_unique<CheckpointStore>(outputs_.directory() / "checkpoints", mpi_, config_.checkpoint.keep,
                                                   plan.run_id);
  if (!plan.note.empty()) log(plan.note);
  if (const std::string note = check_resume_changes(plan.candidates, config_, options_.allow_changed,
                                                    outputs_.directory() / "config.toml", mpi_);
      !note.empty())
    log(note);
  const ResumedRun resumed =
      resume_from(plan, *model_, *optimizer_, *backend_, mpi_, outputs_.directory() / "config.toml");
  if (resumed.resumed) {
    const CheckpointState& state = resumed.state;
    for (const std::string& problem : resumed.passed_over) log("warning: " + problem + "; using an older checkpoint");
    HPCTRAIN_VERIFY(state.step <= total_steps_, InputError,
                    resumed.from.string()
                        << " is at step " << state.step << ", past this deck's " << total_steps_ << " steps",
                    "raise train.steps (or train.epochs) to continue training, or resume with the run's own deck: "
                    "hpctrain train " +
                        (outputs_.directory() / "config.toml").string() + " --resume auto");
    first_step_ = state.step;
    start_schedule(state);
    if (state.step == total_steps_) {
      complete_ = true;
      log("the run in '" + outputs_.directory().string() + "' is already complete at step " +
          std::to_string(state.step) + " (" + resumed.from.string() +
          "); nothing to train. Raise train.steps to train further.");
      return;
    }
    scaler_->restore(state.scalars);
    // A best value of another metric (the deck's checkpoint.best_metric changed) means nothing: start over.
    if (state.best_metric == config_.checkpoint.best_metric) best_.restore(state.best);
    last_scalars_ = scaler_->read();
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
    std::snprintf(seconds, sizeof seconds, "%.4f", resumed.read_seconds);
    log("resumed from " + resumed.from.string() + " at step " + std::to_string(state.step) + " (epoch " +
        std::to_string(state.epoch) + "), read in " + seconds + " s");
  }
  start_weights(resumed.resumed);
  graph_ = std::make_unique<StepGraph>(*backend_, graphs_, first_step_ + graph_warmup_steps);
  outputs_.open(resumed.resumed ? first_step_ : -1, plan.run_id, eval_columns(task_, model_->classes()));
  install_checkpoint_signals(config_.checkpoint.on_signal);
  status_.set_step(first_step_);
}

void Trainer::Impl::start_schedule(const CheckpointState& state) {
  const ScheduleExtension extension =
      options_.extend.empty() ? ScheduleExtension::stretch : parse_schedule_extension(options_.extend);
  const ScheduleStart schedule = schedule_start(state, total_steps_, options_.extend.empty() ? nullptr : &extension);
  schedule_origin_ = schedule.origin;
  if (schedule_origin_ != 0)
    schedule_ =
        std::make_unique<LearningRateSchedule>(config_.schedule, config_.optimizer.lr, total_steps_, schedule_origin_);
  if (!schedule.note.empty()) log(schedule.note);
}

void Trainer::Impl::start_weights(bool resumed) {
  HPCTRAIN_VERIFY(resumed || options_.extend.empty(), InputError,
                  "--extend " << options_.extend << ": the run starts fresh, there is nothing to extend",
                  "--extend applies when resuming a run whose train.steps was raised");
  if (options_.init_from.empty()) return;
  if (resumed) {
    log("--init-from " + options_.init_from + ": not used, the run continues from its own checkpoint");
    return;
  }
  const fs::path from = initialize_from(options_.init_from, *model_, *backend_, mpi_);
  log("parameters initialised from " + from.string() +
      " (--init-from); the optimizer state, the schedule and the step count start fresh");
}

std::string Trainer::Impl::head() const {
  const int ranks = mpi_.size();
  const std::string precision_note = backend_->precision_note(precision_.activations);
  std::ostringstream text;
  text << "hpctrain " << HPCTRAIN_VERSION << ": " << ranks << " rank" << (ranks > 1 ? "s" : "") << " x " << threads_
       << " thread" << (threads_ > 1 ? "s" : "") << ", backend " << backend_->name() << ", precision "
       << precision_.name() << (scaler_->enabled() ? " with loss scaling" : "")
       << (ranks > 1 ? ", gradients all-reduced with " + exchange_name_ : std::string()) << "\n"
       << (graphs_note_.empty() ? std::string() : graphs_note_ + "\n")
       << (precision_note.empty() ? std::string() : precision_note + "\n") << "data: " << train_data_->samples()
       << " training samples"
       << (validation_data_ ? ", " + std::to_string(validation_data_->samples()) + " validation samples" : "")
       << ", global batch " << config_.data.batch_size << " (" << local_batch_ << " per rank), " << steps_per_epoch_
       << " steps per epoch, " << total_steps_ << " steps\n"
       << (train_data_->augmentation() ? "training augmentation: " + train_data_->augmentation()->description() + "\n"
                                       : std::string())
       << "model:\n"
       << model_->summary();
  return text.str();
}

double Trainer::Impl::flush_steps() {
  const FlushedSteps flushed = records_->flush(mpi_.world(), clock_.now());
  for (const StepResult& result : flushed.steps) {
    last_train_loss_ = result.loss;
    last_scalars_ = result.scalars;
    interval_loss_sum_ += result.loss;
    ++interval_steps_;
    step_rates_.push_back(result.rate);
    if (MetricsWriter* metrics = outputs_.metrics())
      metrics->append(
          "train", {static_cast<double>(result.step + 1), result.loss, schedule_->at(result.step), result.rate,
                    result.scalars.grad_norm, result.scale_in_effect, result.scalars.found_nonfinite != 0 ? 1.0 : 0.0});
    scaler_->check(result.scalars, result.step + 1, result.loss);
  }
  return flushed.clock_seconds_per_step;
}

void Trainer::Impl::log_stop(std::int64_t step, bool out_of_time) {
  const int local = pending_checkpoint_signal();
  log(std::string("stopping at step ") + std::to_string(step) + " after " +
      (out_of_time ? "nearing train.time_limit (" + config_.train.time_limit.text + ")"
                   : (local ? signal_name(local) : std::string("a signal on another rank"))) +
      "; the checkpoint is committed. Exit status " + std::to_string(exit_checkpointed) +
      ": continue with --resume auto");
}

void Trainer::Impl::save_checkpoint(std::int64_t step, bool best) {
  CheckpointState state;
  state.scalars = scaler_->read();
  state.step = step;
  state.epoch = loader_->position().epoch;
  state.step_in_epoch = loader_->position().step_in_epoch;
  state.seed = config_.run.seed;
  state.watches_best = watch_best_;
  state.best_metric = config_.checkpoint.best_metric;
  state.best = best_.state();
  state.schedule_origin = schedule_origin_;
  state.schedule_total_steps = total_steps_;
  const double start = MPI_Wtime();
  const std::string path = checkpoints_->save(*model_, *optimizer_, *backend_, state, to_toml(config_), best);
  char line[512];
  std::snprintf(line, sizeof line, "checkpoint %s written in %.4f s%s", path.c_str(), MPI_Wtime() - start,
                best ? " (best: checkpoints/best)" : "");
  log(line);
}

EvalMetrics Trainer::Impl::evaluate(std::int64_t step) {
  const StepContext context{backend_.get(), false, config_.run.seed, static_cast<std::uint32_t>(step), nullptr, 0};
  return evaluate_split(*validation_data_, *model_, *backend_, *device_batch_, task_, eval_local_batch_, context, mpi_);
}

TrainSummary Trainer::Impl::run() {
  TrainSummary summary;
  if (complete_) {  // OUTPUT/status already says so; a --status-file copy hears it again
    if (mpi_.is_root()) status_.write("complete", 0, first_step_);
    return summary;
  }
  const int ranks = mpi_.size();
  log(head());
  for (const std::string& warning : resource_warnings_) log(warning);
  log(run_schedule_->describe(config_.checkpoint.at_end, validation_data_ != nullptr));
  if (stopped_early_before()) return summary;

  const double start = MPI_Wtime();
  double interval_start = start, last_eval_accuracy = -1.0, last_eval_loss = 0.0;
  std::int64_t interval_samples = 0, evaluations = 0;
  std::int64_t step = first_step_;
  bool stopped_early = false;
  double last_checkpoint_time = clock_.now(), recent_step = 0.0, longest_checkpoint = 1.0;
  // A signal during start-up (recorded since main began) is honoured before the first step: the launcher that sent
  // it may kill the ranks a few seconds later, so no step is started first.
  RunControl before_start;
  before_start.signal_seen = pending_checkpoint_signal() != 0;
  before_start.agree(mpi_.world());
  if (before_start.signal_seen) {
    save_checkpoint(step);
    log_stop(step, false);
    summary.exit_code = exit_checkpointed;
  }
  while (step < total_steps_ && summary.exit_code != exit_checkpointed) {
    const double step_start = MPI_Wtime(), decided_at = clock_.now();
    // Rank 0's clock decides time-based checkpoints; the step's agreement tells every rank.
    RunControl control;
    if (mpi_.is_root()) {
      control.clock = run_schedule_->clock_request(
          {decided_at, last_checkpoint_time, construction_time_, recent_step, longest_checkpoint});
    }
    timer_.begin(Phase::data);
    const HostBatch& batch = loader_->next();
    // The batch lives in the loader's ring (CUDA: uploaded from it by DMA); the backend's notes are its cuDNN choices.
    step_->run(batch, step, static_cast<float>(schedule_->at(step)), *graph_, *records_, step_start, decided_at,
               BatchSource::loader_ring);
    for (const std::string& note : backend_->take_notes()) log(note);
    control.signal_seen = pending_checkpoint_signal() != 0;
    control.agree(mpi_.world());
    timer_.end();
    clock_.step_finished();
    const double after_step = MPI_Wtime();
    interval_samples += batch.rows * ranks;
    ++step;
    const bool last = step == total_steps_;
    const bool log_now = step % config_.train.log_every == 0 || last;
    const bool evaluate_now = validation_data_ && run_schedule_->evaluate_after(step, last);
    const bool signalled = control.signal_seen, out_of_time = control.clock == ClockRequest::checkpoint_and_stop;
    const bool periodic = run_schedule_->checkpoint_after(step) || control.clock == ClockRequest::checkpoint;
    bool checkpoint_now = periodic || signalled || out_of_time || (last && config_.checkpoint.at_end);
    Observation best_seen;  // a new best is checkpointed; early stopping ends the run like its last step
    // Results reach the host here: every step on the CPU, at these points (or when the ring is full) on CUDA.
    if (!defer_ || log_now || evaluate_now || checkpoint_now || records_->full()) {
      // A moving average of the step time: one slow step (start-up, a busy node) must not stop the run early.
      const double step_seconds = flush_steps();
      recent_step = recent_step > 0.0 ? 0.9 * recent_step + 0.1 * step_seconds : step_seconds;
    }
    // Deferred steps ran asynchronously: the interval ends when their results arrived.
    const double now = defer_ ? MPI_Wtime() : after_step;

    if (log_now) {
      const double interval_rate = static_cast<double>(interval_samples) / std::max(now - interval_start, 1e-9);
      interval_start = now;
      interval_samples = 0;
      const double eta =
          (now - start) / static_cast<double>(step - first_step_) * static_cast<double>(total_steps_ - step);
      // Epochs count like steps: how many are complete (2.50 = two and a half passes over data.train).
      const double epochs = static_cast<double>(step) / static_cast<double>(steps_per_epoch_);
      // The loss is the mean over the steps since the last line (metrics.h5 has every step's).
      const double interval_loss = interval_loss_sum_ / static_cast<double>(std::max<std::int64_t>(interval_steps_, 1));
      interval_loss_sum_ = 0.0;
      interval_steps_ = 0;
      char line[256];
      std::snprintf(line, sizeof line, "step %6lld/%lld  epoch %.2f  loss %.5f  lr %.3e  %9.0f samples/s%s  ETA %s",
                    static_cast<long long>(step), static_cast<long long>(total_steps_), epochs, interval_loss,
                    schedule_->at(step - 1), interval_rate,
                    scaler_->enabled() ? ("  scale " + number_text(last_scalars_.loss_scale)).c_str() : "",
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
      if (MetricsWriter* writer = outputs_.metrics())
        writer->append("eval", eval_row(step, metrics, task_, model_->classes()));
      std::string note;
      if (watch_best_) best_seen = watch_best(step, metrics, note);
      log("eval at step " + std::to_string(step) + ": " + describe(metrics) + note);
      checkpoint_now = checkpoint_now || best_seen.improved || (best_seen.stop && config_.checkpoint.at_end);
    }

    status_.set_step(step);
    if (checkpoint_now) {
      const double checkpoint_start = clock_.now();
      save_checkpoint(step, best_seen.improved);
      last_checkpoint_time = clock_.now();
      longest_checkpoint = std::max(longest_checkpoint, last_checkpoint_time - checkpoint_start);
    }
    if (signalled || out_of_time) {
      log_stop(step, out_of_time);
      summary.exit_code = exit_checkpointed;
      break;
    }
    if (best_seen.stop) {
      stopped_early = true;
      const std::string reason = early_stopping_reason(config_.checkpoint.best_metric, best_);
      log("early stopping at step " + std::to_string(step) + " of " + std::to_string(total_steps_) + ": " + reason +
          "; best: " + describe_best(config_.checkpoint.best_metric, best_.state()) + " (" +
          (checkpoints_->directory() / "best").string() + ")");
      if (MetricsWriter* writer = outputs_.metrics()) {
        writer->set_integer_attribute("early_stopping_step", step);
        writer->set_attribute("early_stopping", reason);
      }
      break;
    }
  }
  // Only figures this invocation measured: a run stopped before its first evaluation has no validation figure.
  std::ostringstream done;
  done << (summary.exit_code == exit_checkpointed ? "stopped: "
           : stopped_early                        ? "stopped early: "
                                                  : "done: ")
       << step << " steps (" << step - first_step_ << " in this run) in " << format_duration(MPI_Wtime() - start);
  if (step > first_step_) done << "; final train loss " << number_text(last_train_loss_);
  if (evaluations > 0)
    done << (task_ == TaskKind::classification ? ", validation accuracy " + number_text(last_eval_accuracy)
                                               : ", validation mse " + number_text(last_eval_loss));
  // The median of the steps' rates after the first tenth (warm-up), as `hpctrain report` computes it from metrics.h5.
  if (!step_rates_.empty())
    done << ", "
         << std::llround(median(std::vector<double>(
                step_rates_.begin() + static_cast<std::ptrdiff_t>(step_rates_.size() / 10), step_rates_.end())))
         << " samples/s (median)";
  const fs::path& output = outputs_.directory();
  done << "\n"
       << "outputs: " << (output / "metrics.h5").string() << ", " << (output / "config.toml").string() << ", "
       << (output / "train.log").string() << ", " << checkpoints_->directory().string() << "/";
  log(done.str());
  if (timer_.enabled()) log(timer_.report(step - first_step_));
  if (mpi_.is_root())
    status_.write(summary.exit_code == exit_checkpointed ? "checkpointed" : "complete", summary.exit_code, step);
  return summary;
}

Observation Trainer::Impl::watch_best(std::int64_t step, const EvalMetrics& metrics, std::string& note) {
  const BestMetric metric = config_.checkpoint.best_metric;
  Observation seen = best_.observe(step, metric_value(metrics, metric));
  // Every rank saw the same all-reduced metrics; rank 0's decision is made everyone's anyway, since the checkpoint
  // that follows is collective.
  int decision[2] = {seen.improved ? 1 : 0, seen.stop ? 1 : 0};
  HPCTRAIN_MPI_CHECK(MPI_Bcast(decision, 2, MPI_INT, 0, mpi_.world()));
  seen = {decision[0] != 0, decision[1] != 0};
  note = "  (" + observation_note(metric, best_, seen) + ")";
  MetricsWriter* writer = outputs_.metrics();
  if (seen.improved && writer != nullptr) {
    writer->set_attribute("best_metric", std::string(word_of(metric)));
    writer->set_integer_attribute("best_step", best_.state().step);
    writer->set_number_attribute("best_value", best_.state().value);
  }
  return seen;
}

bool Trainer::Impl::stopped_early_before() {
  if (!watch_best_) return false;
  MetricsWriter* writer = outputs_.metrics();
  if (!best_.patience_exhausted()) {
    // A run that continues (its patience raised) has not stopped early any more.
    if (writer != nullptr) {
      writer->remove_attribute("early_stopping_step");
      writer->remove_attribute("early_stopping");
    }
    if (first_step_ > 0 && best_.state().has_best())
      log("best so far: " + describe_best(config_.checkpoint.best_metric, best_.state()));
    return false;
  }
  log("the run in '" + outputs_.directory().string() + "' stopped early at step " + std::to_string(first_step_) + " (" +
      std::to_string(best_.state().stale_evaluations) +
      " evaluations without improvement; best: " + describe_best(config_.checkpoint.best_metric, best_.state()) +
      "); nothing to train. Raise train.early_stopping_patience (or set it to 0) to train further.");
  if (mpi_.is_root()) status_.write("complete", 0, first_step_);
  return true;
}

// ---- CUDA teardown order ----
// The captured graphs go first, then the NCCL communicator they use: NCCL 2.28's ncclCommDestroy waits until no graph
// uses it. On an error path neither happens (release() does nothing then): MPI_Abort ends the processes.
Trainer::Impl::~Impl() {
  if (std::uncaught_exceptions() > 0) return;
  if (backend_) backend_->release_graphs();
  if (exchange_) exchange_->release();
}

Trainer::Trainer(const RunConfig& config, const MpiEnvironment& mpi, const TrainOptions& options)
    : impl_(std::make_unique<Impl>(config, mpi, options)) {}
Trainer::~Trainer() = default;
TrainSummary Trainer::run() { return impl_->run(); }

}  // namespace hpctrain
