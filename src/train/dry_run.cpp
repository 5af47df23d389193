// The dry run: the trainer's set-up checks (train/run_shape.hpp) on the real data, a model built for shapes only, and
// a description of the run instead of the run.
#include "hpctrain/train/dry_run.hpp"

#include <cstdio>
#include <sstream>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/data/batch_loader.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/precision/policy.hpp"
#include "hpctrain/train/resume.hpp"
#include "hpctrain/train/run_continuation.hpp"
#include "hpctrain/train/run_schedule.hpp"
#include "hpctrain/train/run_shape.hpp"

namespace hpctrain {

namespace {

// The step a checkpoint holds, read serially on rank 0: MPI-IO's open would leave a lock-test file's trace in the
// checkpoint directory, and a dry run changes nothing there. Collective (an error ends every rank).
std::int64_t checkpoint_step(const std::string& path, const MpiEnvironment& mpi) {
  std::int64_t step = 0;
  run_on_root(mpi, [&] {
    const auto lock = lock_hdf5();
    const H5Handle file = open_file_read_only(path, "checkpoint");
    const H5Handle dataset = open_dataset(file.get(), "/train/step");
    HPCTRAIN_H5_CHECK(H5Dread(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &step));
  });
  return step;
}

std::string data_text(const TrainingData& data) {
  return data.file() + ": " + std::to_string(data.samples()) + " samples of shape " +
         shape_text(data.model_input_shape());
}

// Per rank; the same on every rank (each holds the whole model). evaluation_rows: an evaluation batch per rank, 0
// without a validation split.
std::string memory_text(const RunConfig& config, const Model& model, std::int64_t rows, TaskKind task,
                        std::int64_t evaluation_rows) {
  const PrecisionPolicy precision = PrecisionPolicy::of(config.precision.mode);
  const auto parameters = static_cast<std::uintmax_t>(model.trainable_parameters());
  const std::uintmax_t master = parameters * dtype_size(precision.master);
  const bool adamw = config.optimizer.type == OptimizerKind::adamw;
  const int state_vectors = adamw ? 2 : (config.optimizer.momentum > 0 ? 1 : 0);
  const std::uintmax_t working =
      precision.activations != precision.master ? parameters * dtype_size(precision.activations) : 0;
  const std::uintmax_t activations = model.memory().activations * static_cast<std::uintmax_t>(rows);
  // Evaluation: a classification model's hits are counted on the backend (two counts); a regression model's output
  // of an evaluation batch is copied to the host in fp32 (a buffer of that size on the backend and one on the host).
  const std::uintmax_t evaluation_copy =
      task == TaskKind::regression
          ? static_cast<std::uintmax_t>(evaluation_rows) * static_cast<std::uintmax_t>(model.output_width()) * 4
          : 0;
  const std::uintmax_t total = 2 * master + state_vectors * master + working + activations + evaluation_copy;
  std::ostringstream text;
  const auto row = [&](const std::string& what, std::uintmax_t bytes) {
    char line[200];
    std::snprintf(line, sizeof line, "  %-44s %12s  (%llu bytes)\n", what.c_str(), byte_size_text(bytes).c_str(),
                  static_cast<unsigned long long>(bytes));
    text << line;
  };
  text << "memory per rank (estimated; every rank holds the whole model):\n";
  row("parameters (" + std::string(word_of(precision.mode)) + " run: fp32 master)", master);
  row("gradients (fp32)", master);
  row(std::string("optimizer state (") + (adamw ? "AdamW exp_avg, exp_avg_sq" : "SGD momentum_buffer") + ")",
      state_vectors * master);
  if (working > 0) row(std::string("16-bit working copy of the parameters"), working);
  row("activations (" + std::to_string(rows) + " rows per rank)", activations);
  if (evaluation_copy > 0) row("evaluation's fp32 copy of the outputs", evaluation_copy);
  row("total", total);
  text << "  parameters and state: the model's " << parameters
       << " parameters x bytes per value (CUDA adds up to 256 bytes of alignment per tensor);\n"
       << "  activations: what the model allocates for its largest batch per rank (micro-batch or evaluation batch):\n"
       << "  each layer's input and the output, two backward scratch buffers and saved statistics, in "
       << dtype_name(precision.activations) << ";\n"
       << "  evaluation: "
       << (task == TaskKind::regression ? "an fp32 copy of an evaluation batch's outputs (the same again on the host)"
                                        : "hits counted on the device, no copy of the outputs")
       << ";\n"
       << "  not counted: the backend's workspaces (oneDNN scratchpads, cuBLASLt/cuDNN), the loader's host batches,\n"
       << "  MPI/NCCL buffers and the CUDA context\n";
  return text.str();
}

std::string schedule_text(const RunConfig& config, std::int64_t total_steps, std::int64_t steps_per_epoch,
                          const TrainingData* validation, std::int64_t eval_rows_per_step) {
  std::ostringstream text;
  const TrainSection& train = config.train;
  // Intervals given in steps or in epochs, as the trainer takes them.
  const RunSchedule schedule(config, steps_per_epoch);
  const std::int64_t eval_every = schedule.evaluation_interval(), checkpoint_every = schedule.checkpoint_interval();
  text << "log: every " << train.log_every << " steps and at the end\n";
  if (validation == nullptr) {
    text << "evaluation: none (no data.validation)\n";
  } else {
    std::int64_t evaluations = eval_every > 0 ? total_steps / eval_every : 0;
    if (eval_every <= 0 || total_steps % eval_every != 0) ++evaluations;  // the last step
    const std::int64_t batches = (validation->samples() + eval_rows_per_step - 1) / eval_rows_per_step;
    text << "evaluation: " << (eval_every > 0 ? "every " + std::to_string(eval_every) + " steps and " : std::string())
         << "at the end: " << evaluations << " evaluation" << (evaluations != 1 ? "s" : "") << " of "
         << validation->samples() << " samples (" << batches << " batches per rank each)\n";
  }
  const CheckpointSection& checkpoint = config.checkpoint;
  text << "checkpoints:";
  if (checkpoint_every > 0)
    text << " every " << checkpoint_every << " steps (" << total_steps / checkpoint_every << "),";
  if (checkpoint.every_seconds > 0) text << " every " << number_text(checkpoint.every_seconds) << " s,";
  if (checkpoint.at_end) text << " at the end,";
  text << " on signals; keeping the newest "
       << (checkpoint.keep > 0 ? std::to_string(checkpoint.keep) : std::string("(all)")) << "\n";
  if (checkpoint.best_metric != BestMetric::none)
    text << "best checkpoint: by validation " << word_of(checkpoint.best_metric) << " (checkpoints/best)"
         << (train.early_stopping_patience > 0
                 ? "; early stopping after " + std::to_string(train.early_stopping_patience) +
                       " evaluations without improvement"
                 : std::string())
         << "\n";
  if (!train.time_limit.text.empty()) text << "time limit: " << train.time_limit.text << "\n";
  return text.str();
}

}  // namespace

std::string dry_run(const RunConfig& config, const MpiEnvironment& mpi, const TrainOptions& options) {
  const int ranks = mpi.size();
  const TaskKind task = task_of(config.model.loss);
  const BatchShape shape = batch_shape(config, ranks);
  TrainingData train(config, "data.train", config.data.train, task);
  train.set_up_augmentation(config);
  std::unique_ptr<TrainingData> validation;
  if (!config.data.validation.empty())
    validation = std::make_unique<TrainingData>(config, "data.validation", config.data.validation, task);
  check_data_fits(config, train, validation.get());

  // The model for its shapes and sizes only: on the CPU (a dry run needs no GPU) and for one row, scaled below.
  const PrecisionPolicy precision = PrecisionPolicy::of(config.precision.mode);
  const std::unique_ptr<Backend> backend = make_cpu_backend();
  Model model(config.model, train.model_input_shape(), *backend, {precision.activations, precision.master, 1},
              config.deck_path);
  check_model_fits_data(config, model, train, validation.get(), mpi);
  std::int64_t steps_per_epoch = 0;
  {
    const BatchLoader loader(train, config.data, mpi, shape.local_batch, config.run.seed);
    steps_per_epoch = loader.steps_per_epoch();
  }
  const std::int64_t total_steps = total_steps_of(config, steps_per_epoch);

  // The start a run would make (read-only: nothing in the output directory is touched).
  const StartPlan plan = agree_start_plan(config, mpi, options.resume, options.force);
  const std::string changes = check_resume_changes(plan.candidates, config, options.allow_changed,
                                                   std::filesystem::path(config.run.output) / "config.toml", mpi);
  std::string start = "fresh";
  if (!plan.candidates.empty()) {
    const std::string& from = plan.candidates.front().string();
    const std::int64_t step = checkpoint_step(from, mpi);
    start = "resume from " + from + " at step " + std::to_string(step) +
            (step >= total_steps ? (step == total_steps ? " (the run is complete: nothing to train)"
                                                        : " (past this deck's steps: the run would refuse to start)")
                                 : " (" + std::to_string(total_steps - step) + " steps to go)");
  } else if (!plan.note.empty()) {
    start = "fresh (" + plan.note + ")";
  }
  if (plan.candidates.empty() && !options.init_from.empty()) {  // read as the run reads it: shapes checked
    start +=
        ", parameters from " + initialize_from(options.init_from, model, *backend, mpi).string() + " (--init-from)";
  }

  std::ostringstream text;
  const std::int64_t accumulate = config.train.accumulate;
  text << "dry run of " << config.deck_path << " on " << ranks << " rank" << (ranks > 1 ? "s" : "") << ": nothing is "
       << "trained or written\n"
       << "device: " << word_of(config.run.device)
       << (config.run.device == Device::cpu ? "" : " (not opened by the dry run: the model is sized on the CPU)")
       << ", precision " << precision.name() << "\n"
       << "data: training " << data_text(train) << "\n";
  if (const SampleAugmentation* augmentation = train.augmentation())
    text << "      training augmentation: " << augmentation->description() << "\n";
  if (validation) text << "      validation " << data_text(*validation) << "\n";
  text << "batches: global " << config.data.batch_size << ", " << shape.local_batch << " samples per rank and step";
  if (accumulate > 1) text << " (" << accumulate << " micro-batches of " << shape.micro_rows << ")";
  text << "; evaluation " << shape.eval_local_batch << " per rank\n"
       << "model:\n"
       << model.summary() << "\n"
       << memory_text(config, model, std::max(shape.micro_rows, shape.eval_local_batch), task,
                      validation ? shape.eval_local_batch : 0);
  char epochs[32];
  std::snprintf(epochs, sizeof epochs, "%.2f", static_cast<double>(total_steps) / static_cast<double>(steps_per_epoch));
  text << "plan: " << total_steps << " steps = " << epochs << " epochs of " << steps_per_epoch
       << " steps (each rank reads " << steps_per_epoch << " batches of " << shape.local_batch
       << " samples per epoch)\n"
       << schedule_text(config, total_steps, steps_per_epoch, validation.get(), shape.eval_local_batch * ranks)
       << "output: " << config.run.output << "\n"
       << "start: " << start << "\n";
  if (!changes.empty()) text << changes << "\n";
  if (mpi.is_root()) {
    std::fputs(text.str().c_str(), stdout);
    std::fflush(stdout);
  }
  return text.str();
}

}  // namespace hpctrain
