// The training loop. One step:
//   read this rank's rows -> input buffers; forward; loss (gradient pre-scaled by loss_scale / global batch);
//   backward, all-reducing gradient buckets as they complete; gradient statistics (non-finite check on the still
//   scaled, all-reduced gradients, global norm, clip coefficient); fused optimizer update (skipped on non-finite
//   gradients); loss-scaler update; metrics.
#include "hpctrain/train/trainer.hpp"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "hpctrain/core/error.hpp"
#include "hpctrain/data/batch_loader.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/io/metrics_writer.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/optim/optimizer.hpp"
#include "hpctrain/optim/schedule.hpp"
#include "hpctrain/train/phase_timer.hpp"
#include "hpctrain/train/signals.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

int choose_thread_count(const RunConfig& config, const MpiEnvironment& mpi) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return omp_get_max_threads();
  if (config.run.threads > 0) return static_cast<int>(config.run.threads);
  cpu_set_t set;
  CPU_ZERO(&set);
  int allowed = static_cast<int>(std::thread::hardware_concurrency());
  if (sched_getaffinity(0, sizeof set, &set) == 0) allowed = CPU_COUNT(&set);
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  if (allowed < hardware) return std::max(1, allowed);  // the launcher bound this rank to its own cores
  return std::max(1, allowed / mpi.local_size());
}

namespace {

DType activation_dtype_of(const std::string& mode) {
  if (mode == "bf16") return DType::bf16;
  if (mode == "fp16") return DType::f16;
  return DType::f32;
}

LossScalerConfig scaler_config_of(const PrecisionSection& precision, float* initial_scale) {
  LossScalerConfig config;
  config.growth_factor = static_cast<float>(precision.growth_factor);
  config.backoff_factor = static_cast<float>(precision.backoff_factor);
  config.growth_interval = static_cast<std::int32_t>(precision.growth_interval);
  *initial_scale = 1.0f;
  const std::string& mode = precision.loss_scale;
  if (mode == "dynamic" || (mode == "auto" && precision.mode == "fp16")) {
    config.enabled = true;
    config.dynamic = true;
    *initial_scale = static_cast<float>(precision.init_scale);
  } else if (mode != "none" && mode != "auto") {
    config.enabled = true;
    config.dynamic = false;
    *initial_scale = std::stof(mode);
  }
  return config;
}

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// "HH:MM:SS", "MM:SS" or "SS" in seconds; 0 for "" (no limit). The parser has checked the format.
double parse_time_limit(const std::string& text) {
  if (text.empty()) return 0.0;
  double seconds = 0.0;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, ':')) seconds = seconds * 60.0 + std::stod(part);
  return seconds;
}

std::string format_duration(double seconds) {
  const auto total = static_cast<long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", total / 3600, (total / 60) % 60, total % 60);
  return text;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// A buffer in backend memory, freed with the backend.
struct BackendBuffer {
  Backend* backend = nullptr;
  void* data = nullptr;
  BackendBuffer() = default;
  BackendBuffer(Backend& owner, std::size_t bytes)
      : backend(&owner), data(owner.allocate(std::max<std::size_t>(bytes, 64))) {}
  BackendBuffer(BackendBuffer&& other) noexcept : backend(other.backend), data(std::exchange(other.data, nullptr)) {}
  BackendBuffer& operator=(BackendBuffer&& other) noexcept {
    std::swap(backend, other.backend);
    std::swap(data, other.data);
    return *this;
  }
  ~BackendBuffer() {
    if (data != nullptr) backend->deallocate(data);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

}  // namespace

class Trainer::Impl {
 public:
  Impl(const RunConfig& config, const MpiEnvironment& mpi, TrainOptions options);
  TrainSummary run();

 private:
  void prepare_output();
  // Resume from a checkpoint (options_.resume), falling back to older ones when the newest is damaged.
  void resume();
  std::string save_checkpoint(std::int64_t step);
  void log(const std::string& line);
  // Copy a host batch into the model's input and the loss's label/target buffers.
  void upload(const HostBatch& batch);
  // Loss forward+backward of the current batch; returns nothing, accumulates into sums_.
  void loss(const TensorView& output, bool with_gradient, std::int64_t global_rows);
  std::pair<double, double> evaluate(std::int64_t step);
  // One optimizer step on a batch; the step's scalars come back in scalars, the global mean loss is returned.
  double train_step(const HostBatch& batch, std::int64_t step, StepScalars& scalars);
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
  std::unique_ptr<GradientAllreduce> allreduce_;
  std::unique_ptr<LearningRateSchedule> schedule_;
  LossScalerConfig scaler_;
  BackendBuffer scalars_, sums_, grad_scale_, staging_, labels_, targets_, sample_ids_;
  HostBatch batch_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::ofstream log_file_;
  fs::path output_;
  int threads_ = 1;
  float scale_in_effect_ = 1.0f;  // the loss scale the current step runs with (finish_step may change it)
  PhaseTimer timer_{false};
  std::int64_t first_step_ = 0;  // 0, or the step a resumed run continues from
  TrainOptions options_;
  std::unique_ptr<CheckpointStore> checkpoints_;
  double control_[3] = {0, 0, 0};
  double construction_time_ = MPI_Wtime();  // all-reduced with the loss each step: loss sum, signal, rank 0's stop request
};

Trainer::Impl::Impl(const RunConfig& config, const MpiEnvironment& mpi, TrainOptions options)
    : config_(config), mpi_(mpi), options_(std::move(options)), task_(config.model.loss == "mse" ? TaskKind::regression : TaskKind::classification) {
  const int ranks = mpi.size();
  const std::int64_t batch = config.data.batch_size;
  HPCTRAIN_VERIFY(batch % ranks == 0, InputError,
                  config.where("data.batch_size") << ": data.batch_size = " << batch << " is not divisible by the "
                                                  << ranks << " ranks of this run",
                  "data.batch_size is the global batch; pick a multiple of the rank count (e.g. " +
                      std::to_string((batch / ranks + 1) * ranks) + ")");
  local_batch_ = batch / ranks;
  const std::int64_t eval_batch = config.data.eval_batch_size > 0 ? config.data.eval_batch_size : batch;
  eval_local_batch_ = std::max<std::int64_t>(1, (eval_batch + ranks - 1) / ranks);
  if (config.run.device == "cuda")
    throw NotSupported(config.where("run.device") + ": run.device = \"cuda\": this build has no CUDA backend yet");

  // ---- data ----
  train_data_ = std::make_unique<TrainingData>(config, "data.train", config.data.train, task_);
  if (!config.data.validation.empty())
    validation_data_ = std::make_unique<TrainingData>(config, "data.validation", config.data.validation, task_);
  HPCTRAIN_VERIFY(train_data_->samples() >= batch, InputError,
                  config.where("data.batch_size") << ": data.batch_size = " << batch << " but '" << config.data.train
                                                  << "' holds only " << train_data_->samples() << " samples",
                  "use a smaller batch or more data: one global batch must fit in the training set");
  if (validation_data_)
    HPCTRAIN_VERIFY(validation_data_->feature_width() == train_data_->feature_width(), InputError,
                    config.where("data.validation") << ": validation samples have " << validation_data_->feature_width()
                                                    << " features, training samples " << train_data_->feature_width());

  // ---- model (validates the layer shapes against the data) ----
  threads_ = choose_thread_count(config, mpi);
  omp_set_num_threads(threads_);
  backend_ = make_cpu_backend();
  ModelBuffers buffers{activation_dtype_of(config.precision.mode), DType::f32,
                       std::max(local_batch_, eval_local_batch_)};
  model_ = std::make_unique<Model>(config.model, train_data_->feature_width(), *backend_, buffers, config.deck_path);
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
  total_steps_ = config.train.steps > 0 ? config.train.steps : config.train.epochs * steps_per_epoch_;

  // ---- optimizer, communication, scaler ----
  optimizer_ = std::make_unique<Optimizer>(config.optimizer, *model_, *backend_);
  std::vector<std::int64_t> layer_begins;
  for (std::size_t i = 0; i < model_->layer_count(); ++i) layer_begins.push_back(model_->parameter_begin(i));
  allreduce_ = std::make_unique<GradientAllreduce>(mpi.world(), static_cast<float*>(model_->gradients()),
                                                   model_->parameter_count(), layer_begins, 25 << 20);
  schedule_ = std::make_unique<LearningRateSchedule>(config.schedule, config.optimizer.lr, total_steps_);
  float initial_scale = 1.0f;
  scaler_ = scaler_config_of(config.precision, &initial_scale);
  scalars_ = BackendBuffer(*backend_, sizeof(StepScalars));
  StepScalars initial;
  initial.loss_scale = initial_scale;
  backend_->copy_to_backend(scalars_.data, &initial, sizeof initial);
  sums_ = BackendBuffer(*backend_, sizeof(LossSums));
  grad_scale_ = BackendBuffer(*backend_, sizeof(float));
  const std::int64_t max_rows = buffers.max_rows;
  if (buffers.activation_dtype != DType::f32)
    staging_ = BackendBuffer(*backend_, static_cast<std::size_t>(max_rows * model_->input_width()) * sizeof(float));
  labels_ = BackendBuffer(*backend_, static_cast<std::size_t>(max_rows) * sizeof(std::int32_t));
  targets_ = BackendBuffer(*backend_, static_cast<std::size_t>(max_rows * model_->output_width()) * sizeof(float));
  sample_ids_ = BackendBuffer(*backend_, static_cast<std::size_t>(max_rows) * sizeof(std::int64_t));
  model_->initialize(config.run.seed);

  output_ = config.run.output;
  checkpoints_ = std::make_unique<CheckpointStore>(output_ / "checkpoints", mpi, config.checkpoint.keep);
  resume();
  prepare_output();
  install_checkpoint_signals(config.checkpoint.on_signal);
}

void Trainer::Impl::resume() {
  if (options_.resume.empty()) return;
  std::vector<fs::path> candidates;
  if (options_.resume == "auto") {
    candidates = checkpoints_->candidates();
    if (candidates.empty()) {
      log("resume auto: no checkpoint in " + checkpoints_->directory().string() + "; starting fresh");
      return;
    }
  } else {
    candidates.push_back(options_.resume);
  }
  std::string failures;
  for (const fs::path& candidate : candidates) {
    CheckpointState state;
    std::string problem;
    try {
      load_checkpoint(candidate.string(), *model_, *optimizer_, *backend_, state, mpi_);
    } catch (const Error& error) {
      problem = error.what();
    }
    // Every rank reads the same file, so they fail alike; agree anyway so no rank goes on alone.
    int failed = problem.empty() ? 0 : 1;
    HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, mpi_.world()));
    if (failed) {
      if (problem.empty()) problem = "another rank could not load it";
      failures += "\n  " + problem;
      if (problem.find("different model") != std::string::npos || problem.find("needs") != std::string::npos ||
          problem.find("deck asks") != std::string::npos)
        throw InputError(problem, "resume with the deck the checkpoint was written with (stored in its 'deck' attribute)");
      log("warning: " + problem + (candidate != candidates.back() ? "; trying an older checkpoint" : ""));
      continue;
    }
    HPCTRAIN_VERIFY(state.step <= total_steps_, InputError,
                    candidate.string() << " is at step " << state.step << ", past this deck's " << total_steps_
                                       << " steps",
                    "raise train.steps (or train.epochs) to continue training");
    first_step_ = state.step;
    state.scalars.found_nonfinite = 0;
    backend_->copy_to_backend(scalars_.data, &state.scalars, sizeof state.scalars);
    LoaderPosition position{state.epoch, state.step_in_epoch};
    if (position.step_in_epoch >= steps_per_epoch_) position = {position.epoch + 1, 0};  // other rank count
    loader_->seek(position);
    log("resumed from " + candidate.string() + " at step " + std::to_string(state.step) + " (epoch " +
        std::to_string(state.epoch) + ")");
    return;
  }
  throw InputError("no usable checkpoint to resume from:" + failures,
                   "start a fresh run (without --resume) or point --resume at a sound checkpoint");
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
  std::snprintf(line, sizeof line, "checkpoint %s written in %.2f s", path.c_str(), MPI_Wtime() - start);
  log(line);
  return path;
}

void Trainer::Impl::prepare_output() {
  run_on_root(mpi_, [&] {
    const std::string where = config_.where("run.output");
    std::error_code error;
    if (options_.resume.empty() && fs::exists(output_ / "metrics.h5", error))
      throw InputError(where + ": output directory '" + output_.string() + "' already holds a run (metrics.h5)",
                       "continue it with --resume auto, choose another directory with --output DIR, or remove it");
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
    log_file_.open(output_ / "train.log", options_.resume.empty() ? std::ios::trunc : std::ios::app);
    const std::string metrics_path = (output_ / "metrics.h5").string();
    // A resumed run keeps the rows up to its checkpoint; a fresh start under --resume auto keeps none.
    metrics_ = options_.resume.empty() ? std::make_unique<MetricsWriter>(metrics_path)
                                       : std::make_unique<MetricsWriter>(metrics_path, first_step_);
    metrics_->define("train", {{"step", MetricKind::int64},
                               {"loss", MetricKind::float64},
                               {"lr", MetricKind::float64},
                               {"samples_per_sec", MetricKind::float64},
                               {"grad_norm", MetricKind::float64},
                               {"loss_scale", MetricKind::float64},
                               {"skipped", MetricKind::int64}});
    std::vector<std::pair<std::string, MetricKind>> eval{{"step", MetricKind::int64}, {"loss", MetricKind::float64}};
    if (task_ == TaskKind::classification) eval.push_back({"accuracy", MetricKind::float64});
    metrics_->define("eval", eval);
  });
}

void Trainer::Impl::log(const std::string& line) {
  if (!mpi_.is_root()) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (log_file_.is_open()) log_file_ << line << std::endl;
}

void Trainer::Impl::upload(const HostBatch& batch) {
  const std::int64_t rows = batch.rows;
  const TensorView input = model_->input(rows);
  const std::size_t feature_bytes = static_cast<std::size_t>(rows * model_->input_width()) * sizeof(float);
  if (input.dtype == DType::f32) {
    backend_->copy_to_backend(input.data, batch.features.data(), feature_bytes);
  } else {
    backend_->copy_to_backend(staging_.data, batch.features.data(), feature_bytes);
    backend_->cast({staging_.data, DType::f32, rows, model_->input_width()}, input);
  }
  if (task_ == TaskKind::classification)
    backend_->copy_to_backend(labels_.data, batch.labels.data(), static_cast<std::size_t>(rows) * sizeof(std::int32_t));
  else
    backend_->copy_to_backend(targets_.data, batch.targets.data(),
                              static_cast<std::size_t>(rows * model_->output_width()) * sizeof(float));
  backend_->copy_to_backend(sample_ids_.data, batch.sample_ids.data(),
                            static_cast<std::size_t>(rows) * sizeof(std::int64_t));
}

void Trainer::Impl::loss(const TensorView& output, bool with_gradient, std::int64_t global_rows) {
  TensorView gradient = output;
  if (!with_gradient) gradient.data = nullptr;
  if (with_gradient) {
    // d(mean loss over the global batch)/d(output), times the loss scale; the all-reduce then sums the ranks' parts.
    StepScalars host;
    backend_->copy_to_host(&host, scalars_.data, sizeof host);
    scale_in_effect_ = host.loss_scale;
    const float scale = host.loss_scale / static_cast<float>(global_rows);
    backend_->copy_to_backend(grad_scale_.data, &scale, sizeof scale);
  }
  if (task_ == TaskKind::classification)
    backend_->softmax_cross_entropy(output, labels_.as<std::int32_t>(), grad_scale_.as<float>(), gradient,
                                    sums_.as<LossSums>());
  else
    backend_->mean_squared_error(output, targets_.data, grad_scale_.as<float>(), gradient, sums_.as<LossSums>());
}

std::pair<double, double> Trainer::Impl::evaluate(std::int64_t step) {
  // Each rank takes samples rank, rank + R, ...: every sample once, no padding counted.
  const TrainingData& data = *validation_data_;
  std::vector<std::int64_t> mine;
  for (std::int64_t i = mpi_.rank(); i < data.samples(); i += mpi_.size()) mine.push_back(i);
  backend_->zero(sums_.data, sizeof(LossSums));
  StepContext context{
      backend_.get(), false, config_.run.seed, static_cast<std::uint32_t>(step), sample_ids_.as<std::int64_t>(), 0};
  for (std::size_t begin = 0; begin < mine.size(); begin += static_cast<std::size_t>(eval_local_batch_)) {
    const auto count = static_cast<std::int64_t>(std::min<std::size_t>(eval_local_batch_, mine.size() - begin));
    data.read(mine.data() + begin, count, batch_);
    upload(batch_);
    context.rows = count;
    loss(model_->forward(context), false, 0);
  }
  LossSums sums;
  backend_->copy_to_host(&sums, sums_.data, sizeof sums);
  double totals[2] = {sums.loss_sum, sums.correct};
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_DOUBLE, MPI_SUM, mpi_.world()));
  const double count = static_cast<double>(data.samples());
  return {totals[0] / count, totals[1] / count};
}

double Trainer::Impl::train_step(const HostBatch& batch, std::int64_t step, StepScalars& scalars) {
  timer_.begin(Phase::forward);
  upload(batch);
  const std::int64_t global_rows = batch.rows * mpi_.size();
  const auto learning_rate = static_cast<float>(schedule_->at(step));
  backend_->copy_to_backend(scalars_.as<char>() + offsetof(StepScalars, learning_rate), &learning_rate,
                            sizeof learning_rate);
  const StepContext context{backend_.get(), true, config_.run.seed, static_cast<std::uint32_t>(step),
                            sample_ids_.as<std::int64_t>(), batch.rows};
  backend_->zero(sums_.data, sizeof(LossSums));
  const TensorView output = model_->forward(context);
  loss(output, true, global_rows);

  timer_.begin(Phase::backward);
  allreduce_->begin_step();
  model_->backward(context, false, [&](std::int64_t begin) { allreduce_->ready_from(begin); });
  timer_.begin(Phase::allreduce);
  allreduce_->finish();

  timer_.begin(Phase::optimizer);
  optimizer_->gradient_statistics(scalars_.as<StepScalars>());
  optimizer_->step(scalars_.as<StepScalars>());
  backend_->finish_step(scaler_, scalars_.as<StepScalars>());
  LossSums sums;
  backend_->copy_to_host(&scalars, scalars_.data, sizeof scalars);
  backend_->copy_to_host(&sums, sums_.data, sizeof sums);
  // One small reduction per step carries the loss and the stop requests (a signal on any rank, rank 0's clock).
  control_[0] = sums.loss_sum;
  control_[1] = pending_checkpoint_signal();
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, control_, 3, MPI_DOUBLE, MPI_SUM, mpi_.world()));
  timer_.end();
  return control_[0] / static_cast<double>(global_rows);
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
  const int ranks = mpi_.size();
  timer_ = PhaseTimer(config_.train.profile);
  if (mpi_.is_root()) {
    std::ostringstream head;
    head << "hpctrain " << HPCTRAIN_VERSION << ": " << ranks << " rank" << (ranks > 1 ? "s" : "") << " x " << threads_
         << " thread" << (threads_ > 1 ? "s" : "") << ", backend " << backend_->name() << ", precision "
         << config_.precision.mode << (scaler_.enabled ? " with loss scaling" : "") << "\n"
         << "data: " << train_data_->samples() << " training samples"
         << (validation_data_ ? ", " + std::to_string(validation_data_->samples()) + " validation samples" : "")
         << ", global batch " << config_.data.batch_size << " (" << local_batch_ << " per rank), " << steps_per_epoch_
         << " steps per epoch, " << total_steps_ << " steps\n"
         << "model:\n"
         << model_->summary();
    log(head.str());
  }

  const double start = MPI_Wtime();
  double interval_start = start, last_eval_accuracy = -1.0, last_eval_loss = 0.0, last_train_loss = 0.0;
  std::int64_t interval_samples = 0;
  std::vector<double> interval_rates;
  std::int64_t step = first_step_;
  const double time_limit = parse_time_limit(config_.train.time_limit);
  double last_checkpoint_time = start, longest_step = 0.0, longest_checkpoint = 1.0;
  while (step < total_steps_) {
    const double step_start = MPI_Wtime();
    // Rank 0's clock decides time-based checkpoints (1: checkpoint, 2: checkpoint and stop); the step's reduction
    // tells every rank.
    control_[2] = 0.0;
    if (mpi_.is_root()) {
      if (config_.checkpoint.every_seconds > 0 && step_start - last_checkpoint_time >= config_.checkpoint.every_seconds)
        control_[2] = 1.0;
      if (time_limit > 0 && step_start - construction_time_ + 3 * longest_step + 2 * longest_checkpoint >= time_limit)
        control_[2] = 2.0;
    }
    const std::int64_t epoch = loader_->position().epoch;
    timer_.begin(Phase::data);
    const HostBatch& batch = loader_->next();
    StepScalars scalars;
    const double train_loss = train_step(batch, step, scalars);
    last_train_loss = train_loss;
    const std::int64_t global_rows = batch.rows * ranks;
    const double now = MPI_Wtime();
    const double rate = static_cast<double>(global_rows) / std::max(now - step_start, 1e-9);
    interval_samples += global_rows;
    const bool skipped = scalars.found_nonfinite != 0;
    if (metrics_)
      metrics_->append("train", {static_cast<double>(step + 1), train_loss, schedule_->at(step), rate,
                                 scalars.grad_norm, scale_in_effect_, skipped ? 1.0 : 0.0});
    check_numerics(scalars, step, train_loss);
    ++step;
    longest_step = std::max(longest_step, MPI_Wtime() - step_start);

    const bool last = step == total_steps_;
    if (step % config_.train.log_every == 0 || last) {
      const double interval_rate = static_cast<double>(interval_samples) / std::max(now - interval_start, 1e-9);
      if (step > first_step_ + 1 || last) interval_rates.push_back(interval_rate);
      interval_start = now;
      interval_samples = 0;
      const double eta = (now - start) / static_cast<double>(step - first_step_) * static_cast<double>(total_steps_ - step);
      char line[256];
      std::snprintf(line, sizeof line, "step %6lld/%lld  epoch %lld  loss %.5f  lr %.3e  %9.0f samples/s%s  ETA %s",
                    static_cast<long long>(step), static_cast<long long>(total_steps_), static_cast<long long>(epoch),
                    train_loss, schedule_->at(step - 1), interval_rate,
                    scaler_.enabled ? ("  scale " + number_text(scalars.loss_scale)).c_str() : "",
                    format_duration(eta).c_str());
      log(line);
    }
    const bool evaluate_now =
        validation_data_ && (last || (config_.train.eval_every > 0 && step % config_.train.eval_every == 0));
    if (evaluate_now) {
      timer_.begin(Phase::evaluation);
      const auto [eval_loss, accuracy] = evaluate(step);
      timer_.end();
      last_eval_loss = eval_loss;
      char line[160];
      if (task_ == TaskKind::classification) {
        last_eval_accuracy = accuracy;
        std::snprintf(line, sizeof line, "eval at step %lld: loss %.5f  accuracy %.4f", static_cast<long long>(step),
                      eval_loss, accuracy);
        if (metrics_) metrics_->append("eval", {static_cast<double>(step), eval_loss, accuracy});
      } else {
        std::snprintf(line, sizeof line, "eval at step %lld: loss (mse) %.6f", static_cast<long long>(step),
                      eval_loss);
        if (metrics_) metrics_->append("eval", {static_cast<double>(step), eval_loss});
      }
      log(line);
    }

    const bool signalled = control_[1] > 0, out_of_time = control_[2] > 1.5;
    const bool periodic = (config_.checkpoint.every_steps > 0 && step % config_.checkpoint.every_steps == 0) ||
                          control_[2] > 0.5;
    if (periodic || signalled || out_of_time || (last && config_.checkpoint.at_end)) {
      const double checkpoint_start = MPI_Wtime();
      save_checkpoint(step);
      last_checkpoint_time = MPI_Wtime();
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
  std::ostringstream done;
  done << "done: " << step << " steps in " << format_duration(summary.seconds) << "; final train loss "
       << number_text(last_train_loss);
  if (validation_data_)
    done << (task_ == TaskKind::classification ? ", validation accuracy " + number_text(last_eval_accuracy)
                                               : ", validation mse " + number_text(last_eval_loss));
  done << ", " << static_cast<long long>(summary.samples_per_second) << " samples/s (median)\n"
       << "outputs: " << (output_ / "metrics.h5").string() << ", " << (output_ / "config.toml").string() << ", "
       << (output_ / "train.log").string();
  log(done.str());
  if (timer_.enabled()) log(timer_.report(step - first_step_));
  return summary;
}

Trainer::Trainer(const RunConfig& config, const MpiEnvironment& mpi, const TrainOptions& options)
    : impl_(std::make_unique<Impl>(config, mpi, options)) {}
Trainer::~Trainer() = default;
TrainSummary Trainer::run() { return impl_->run(); }

}  // namespace hpctrain
