// `hpctrain predict` and `hpctrain evaluate`: apply a checkpoint's model (its deck is stored in the checkpoint) to a
// dataset, sharded over the ranks like training evaluation, without gradients or optimizer state.
#include <hdf5.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "data_tools.hpp"
#include "hpctrain/app/command_line.hpp"
#include "hpctrain/app/commands.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/io/metrics_writer.hpp"
#include "hpctrain/io/parallel_file.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/precision/policy.hpp"
#include "hpctrain/train/backend_choice.hpp"
#include "hpctrain/train/checkpointing.hpp"
#include "hpctrain/train/device_batch.hpp"
#include "hpctrain/train/evaluation.hpp"
#include "hpctrain/train/rank_resources.hpp"
#include "hpctrain/train/run_shape.hpp"

namespace hpctrain {

namespace {

namespace fs = std::filesystem;

struct InferenceArguments {
  std::string checkpoint, data, output;
  std::vector<std::string> overrides;  // --set, then run.device from --device (so --device wins)
  bool force = false;
};

// The command line of predict and evaluate; the checkpoint may be named as a file, a run directory or its
// checkpoints/latest (resolve_checkpoint). Returns nullopt after printing the usage for --help.
std::optional<InferenceArguments> parse_inference_arguments(const Arguments& args, const std::string& command,
                                                            const char* usage, const MpiEnvironment& mpi) {
  const CommandLine line(
      args, "hpctrain " + command,
      {{"--data", true}, {"--output", true}, {"--set", true, true}, {"--device", true}, {"--force", false}});
  if (print_help_if_asked(line, usage, mpi)) return std::nullopt;
  const auto& words = line.positionals();
  HPCTRAIN_VERIFY(words.size() <= 1, InputError,
                  line.command() << ": unexpected argument '" << words[words.size() - 1] << "'", line.help_hint());
  HPCTRAIN_VERIFY(words.size() == 1 && line.has("--data"), InputError,
                  line.command() << ": needs a checkpoint and --data FILE.h5",
                  "usage: " + line.command() + " CHECKPOINT.h5 --data FILE.h5");
  InferenceArguments parsed;
  parsed.checkpoint = resolve_checkpoint(words[0]).string();
  parsed.data = line.value("--data");
  parsed.output = line.value_or("--output", "");
  parsed.overrides = line.values("--set");
  if (line.has("--device")) parsed.overrides.push_back(device_override(line));
  parsed.force = line.has("--force");
  return parsed;
}

// The checkpoint's deck, with --set overrides; the model and the backend set up for inference.
struct InferenceSetup {
  RunConfig config;
  TaskKind task;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::int64_t local_batch = 0;
};

RunConfig checkpoint_config(const InferenceArguments& arguments) {
  return parse_run_config(checkpoint_deck(arguments.checkpoint), arguments.checkpoint, arguments.overrides);
}

InferenceSetup set_up(const InferenceArguments& arguments, const RunConfig& config, const TrainingData& data,
                      const MpiEnvironment& mpi) {
  const SampleShape data_shape = data.model_input_shape();
  const std::int64_t data_width = shape_size(data_shape);
  InferenceSetup setup;
  setup.config = config;
  setup.task = task_of(config.model.loss);
  const std::int64_t trained_width = checkpoint_input_features(arguments.checkpoint);
  if (data.holds_tokens()) {
    // A language model's position table has one row per position of the windows it was trained on.
    HPCTRAIN_VERIFY(
        data_width == trained_width, InputError,
        "'" << arguments.data << "': windows of " << data_width << " tokens, but the model in '" << arguments.checkpoint
            << "' reads windows of " << trained_width << " tokens",
        "cut the file into the model's windows with --set data.sequence_length=" + std::to_string(trained_width));
  } else {
    HPCTRAIN_VERIFY(config.model.layers.empty() || config.model.layers.front().type != LayerType::embedding, InputError,
                    "'" << arguments.data << "': samples of " << data_width << " features, but the model in '"
                        << arguments.checkpoint << "' is a language model (its first layer an embedding)",
                    "give it a token file ('hpctrain data convert --text' or --tokens makes one)");
    HPCTRAIN_VERIFY(data_width == trained_width, InputError,
                    "'" << arguments.data << "': samples have " << data_width << " features, but the model in '"
                        << arguments.checkpoint << "' takes " << trained_width,
                    "apply the model to data shaped like its training data");
  }
  omp_set_num_threads(choose_thread_count(setup.config, mpi));
  // The deck's run.device (or --device), chosen as training chooses: "cuda" without a GPU stops every rank with one
  // message, "auto" falls back to the CPU and says why.
  BackendChoice choice = choose_backend(setup.config, mpi);
  setup.backend = std::move(choice.backend);
  if (!choice.fallback.empty() && mpi.is_root())
    std::printf("run.device = \"auto\": on the CPU (%s)\n", choice.fallback.c_str());
  const std::int64_t batch =
      setup.config.data.eval_batch_size > 0 ? setup.config.data.eval_batch_size : setup.config.data.batch_size;
  setup.local_batch = std::max<std::int64_t>(1, (batch + mpi.size() - 1) / mpi.size());
  const PrecisionPolicy precision = PrecisionPolicy::of(setup.config.precision.mode);
  setup.model = std::make_unique<Model>(setup.config.model, data_shape, *setup.backend,
                                        ModelBuffers{precision.activations, precision.master, setup.local_batch, false},
                                        arguments.checkpoint);
  // Token data: the model must read ids and score the next token at every position (training's check, whose
  // validation of the ids is collective); feature data is validated by the caller.
  if (data.holds_tokens()) check_model_fits_data(setup.config, *setup.model, data, nullptr, mpi);
  load_parameters(arguments.checkpoint, *setup.model, *setup.backend, mpi);
  return setup;
}

// Per row of logits (rows, width): the softmax probabilities and the class of the largest logit.
void softmax_and_argmax(const std::vector<float>& logits, std::int64_t width, std::vector<float>& probabilities,
                        std::vector<std::int32_t>& classes) {
  const std::size_t rows = logits.size() / static_cast<std::size_t>(width);
  probabilities.resize(logits.size());
  classes.resize(rows);
  for (std::size_t row = 0; row < rows; ++row) {
    const float* logit = logits.data() + row * static_cast<std::size_t>(width);
    float* probability = probabilities.data() + row * static_cast<std::size_t>(width);
    const float largest = *std::max_element(logit, logit + width);
    double total = 0.0;
    for (std::int64_t k = 0; k < width; ++k) total += probability[k] = std::exp(logit[k] - largest);
    for (std::int64_t k = 0; k < width; ++k) probability[k] = static_cast<float>(probability[k] / total);
    classes[row] = static_cast<std::int32_t>(std::max_element(logit, logit + width) - logit);
  }
}

// Writes a dataset of `samples` rows (`columns` values each; 0: a 1-D dataset) collectively, rank r's rows being r,
// r + R, ... (evaluation_share), `rows` of them at `data`: one strided hyperslab per rank.
struct RowWriter {
  hid_t file, transfer;
  const MpiEnvironment& mpi;
  std::int64_t samples;
  hsize_t rows;

  void operator()(const char* name, hid_t file_type, hid_t memory_type, std::int64_t columns, const void* data) const {
    write_step_collectively(mpi, [&] {
      const hsize_t dims[2] = {static_cast<hsize_t>(samples), static_cast<hsize_t>(columns)};
      const int rank = columns > 0 ? 2 : 1;
      H5Handle space(HPCTRAIN_H5_CHECK(H5Screate_simple(rank, dims, nullptr)));
      H5Handle dataset(
          HPCTRAIN_H5_CHECK(H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
      const hsize_t start[2] = {static_cast<hsize_t>(mpi.rank()), 0}, stride[2] = {static_cast<hsize_t>(mpi.size()), 1},
                    count[2] = {rows, static_cast<hsize_t>(std::max<std::int64_t>(columns, 1))};
      const hsize_t memory_dims[2] = {std::max<hsize_t>(rows, 1), count[1]};
      H5Handle memory(HPCTRAIN_H5_CHECK(H5Screate_simple(rank, memory_dims, nullptr)));
      if (rows > 0) {
        HPCTRAIN_H5_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, stride, count, nullptr));
      } else {
        HPCTRAIN_H5_CHECK(H5Sselect_none(space.get()));
        HPCTRAIN_H5_CHECK(H5Sselect_none(memory.get()));
      }
      HPCTRAIN_H5_CHECK(H5Dwrite(dataset.get(), memory_type, memory.get(), space.get(), transfer, data));
    });
  }
};

const char* const predict_usage =
    "usage: hpctrain predict CHECKPOINT.h5 --data FILE.h5 [--output predictions.h5] [--set section.key=value]...\n"
    "                        [--device cpu|cuda|auto] [--force]\n"
    "\n"
    "CHECKPOINT.h5 may also be a run directory or its checkpoints/latest (the newest checkpoint) or\n"
    "checkpoints/best (the best by the run's checkpoint.best_metric).\n"
    "Run the checkpoint's model (its deck is stored in the checkpoint) over every sample of FILE.h5 (the dataset\n"
    "data.features, transformed by the deck's data.log1p/scale/shift/mean/std as in training), sharded over the ranks, "
    "in the\n"
    "deck's precision, and write one HDF5 file (written by all ranks together) with /predictions (N x outputs,\n"
    "fp32, in the file's sample order), /indices (N), and for classification /probabilities (softmax) and /classes\n"
    "(argmax). Token data (a language model): /next_tokens (N x T, int32: the argmax at each position),\n"
    "/target_log_probabilities (N x T, fp32: log softmax at the next token of the file), /targets (N x T) and\n"
    "/indices (N), one row per window. Default output: predictions.h5.\n"
    "--device runs it on the CPU, the GPU or whichever the node has (default: the deck's run.device).\n";

const char* const evaluate_usage =
    "usage: hpctrain evaluate CHECKPOINT.h5 --data FILE.h5 [--output evaluation.h5] [--set section.key=value]...\n"
    "                         [--device cpu|cuda|auto] [--force]\n"
    "\n"
    "CHECKPOINT.h5 may also be a run directory or its checkpoints/latest (the newest checkpoint) or\n"
    "checkpoints/best (the best by the run's checkpoint.best_metric).\n"
    "The deck's loss and metrics (classification: accuracy, top-5 accuracy with more than 5 classes; regression:\n"
    "MSE, MAE, R^2) of the checkpoint's model on FILE.h5, printed and, with --output, written to HDF5 as /eval/...\n"
    "On token data: the cross-entropy and accuracy per position, over every position of every window of FILE.h5\n"
    "(training's validation loss on the same file and checkpoint).\n"
    "--device runs it on the CPU, the GPU or whichever the node has (default: the deck's run.device).\n";

}  // namespace

int predict_command(const Arguments& args, const MpiEnvironment& mpi) {
  const auto parsed = parse_inference_arguments(args, "predict", predict_usage, mpi);
  if (!parsed) return 0;
  const InferenceArguments& arguments = *parsed;
  const std::string output = arguments.output.empty() ? "predictions.h5" : arguments.output;
  refuse_to_overwrite(output, arguments.force, mpi);
  // The reader training and evaluation use (so the deck's data.log1p/scale/shift and standardisation apply), without
  // labels; token windows come with their targets (the next tokens) all the same.
  const RunConfig deck = checkpoint_config(arguments);
  const TrainingData data(deck, "--data", arguments.data, task_of(deck.model.loss), DataContents::features_only);
  InferenceSetup setup = set_up(arguments, deck, data, mpi);
  if (!data.holds_tokens()) data.validate(mpi, 0);
  Model& model = *setup.model;
  Backend& backend = *setup.backend;
  DeviceBatch device(backend, model, setup.local_batch);
  const std::int64_t samples = data.samples(), width = model.output_width();

  // Forward over this rank's samples (rank, rank + R, ...), in that order. Feature data keeps each output row; token
  // data keeps, per position, the most likely next token and the log-probability of the target (the logits of a
  // window, T x vocabulary values, are far too many to write).
  const std::vector<std::int64_t> mine = evaluation_share(samples, mpi.rank(), mpi.size());
  const std::int64_t positions = data.holds_tokens() ? model.positions() : 0, classes = model.classes();
  std::vector<float> outputs;                   // (mine, width) feature data
  std::vector<std::int32_t> next_tokens;        // (mine, T) token data: argmax of each position's logits
  std::vector<std::int32_t> targets;            // (mine, T) token data: the window's next tokens
  std::vector<float> target_log_probabilities;  // (mine, T) token data: log softmax at the target
  const std::size_t kept = mine.size() * static_cast<std::size_t>(data.holds_tokens() ? positions : width);
  if (data.holds_tokens()) {
    next_tokens.reserve(kept);
    targets.reserve(kept);
    target_log_probabilities.reserve(kept);
  } else {
    outputs.reserve(kept);
  }
  const StepContext context{&backend, false, deck.run.seed, 0, nullptr, 0};
  // Token data: each position's argmax and log-probability of its target on the backend (Backend::score_targets), so
  // only those leave it, not the T x vocabulary logits of a window.
  const std::size_t batch_positions = data.holds_tokens() ? static_cast<std::size_t>(setup.local_batch * positions) : 0;
  BackendBuffer device_targets(backend, batch_positions * sizeof(std::int32_t));
  BackendBuffer device_next_tokens(backend, batch_positions * sizeof(std::int32_t));
  BackendBuffer device_log_probabilities(backend, batch_positions * sizeof(float));
  forward_split(
      data, model, backend, device, setup.local_batch, context, mpi,
      [&](const HostBatch& batch, const TensorView& output, const float* host) {
        if (!data.holds_tokens()) {
          outputs.insert(outputs.end(), host, host + batch.rows * width);
          return;
        }
        const std::int32_t* target = batch.token_targets.data();
        const std::int64_t scored_rows = batch.rows * positions;
        const std::size_t first = targets.size(), count = static_cast<std::size_t>(scored_rows);
        targets.insert(targets.end(), target, target + scored_rows);
        next_tokens.resize(first + count);
        target_log_probabilities.resize(first + count);
        backend.copy_to_backend(device_targets.data, target, count * sizeof(std::int32_t));
        backend.score_targets({output.data, output.dtype, scored_rows, classes}, device_targets.as<std::int32_t>(),
                              device_next_tokens.as<std::int32_t>(), device_log_probabilities.as<float>());
        backend.copy_to_host(next_tokens.data() + first, device_next_tokens.data, count * sizeof(std::int32_t));
        backend.copy_to_host(target_log_probabilities.data() + first, device_log_probabilities.data,
                             count * sizeof(float));
      },
      data.holds_tokens() ? HostOutputs::none : HostOutputs::copied);

  // Write: rank r's rows are samples r, r + R, ...: one strided hyperslab per rank, collective.
  std::vector<float> probabilities;
  std::vector<std::int32_t> predicted_classes;
  const bool classification = setup.task == TaskKind::classification && !data.holds_tokens();
  if (classification) softmax_and_argmax(outputs, width, probabilities, predicted_classes);
  const std::int64_t values_per_row = data.holds_tokens() ? 3 * positions : (classification ? 2 : 1) * width + 1;
  const std::uintmax_t expected_bytes =
      static_cast<std::uintmax_t>(samples) * (sizeof(std::int64_t) + values_per_row * sizeof(float)) + (64 << 10);
  const CollectiveWrite request{
      output, "predictions file", expected_bytes, "", "free space there or choose another --output", {}};
  write_file_collectively(request, mpi, [&](hid_t file, hid_t transfer) {
    const RowWriter write{file, transfer, mpi, samples, static_cast<hsize_t>(mine.size())};
    if (data.holds_tokens()) {
      write("next_tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, positions, next_tokens.data());
      write("target_log_probabilities", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, positions, target_log_probabilities.data());
      write("targets", H5T_STD_I32LE, H5T_NATIVE_INT32, positions, targets.data());
    } else {
      write("predictions", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, width, outputs.data());
    }
    write("indices", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, mine.data());
    if (classification) {
      write("probabilities", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, width, probabilities.data());
      write("classes", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, predicted_classes.data());
    }
    write_step_collectively(mpi, [&] {
      write_string_attribute(file, "checkpoint", arguments.checkpoint);
      write_string_attribute(file, "data", arguments.data);
    });
  });
  if (mpi.is_root()) {
    if (data.holds_tokens())
      std::printf("wrote predictions for %lld windows of %lld tokens to %s\n", static_cast<long long>(samples),
                  static_cast<long long>(positions), output.c_str());
    else
      std::printf("wrote predictions for %lld samples to %s\n", static_cast<long long>(samples), output.c_str());
  }
  return 0;
}

int evaluate_command(const Arguments& args, const MpiEnvironment& mpi) {
  const auto parsed = parse_inference_arguments(args, "evaluate", evaluate_usage, mpi);
  if (!parsed) return 0;
  const InferenceArguments& arguments = *parsed;
  if (!arguments.output.empty()) refuse_to_overwrite(arguments.output, arguments.force, mpi);
  const RunConfig deck = checkpoint_config(arguments);
  const TaskKind task = task_of(deck.model.loss);
  const TrainingData data(deck, "--data", arguments.data, task);
  InferenceSetup setup = set_up(arguments, deck, data, mpi);
  if (!data.holds_tokens()) data.validate(mpi, task == TaskKind::classification ? setup.model->output_width() : 0);
  DeviceBatch device(*setup.backend, *setup.model, setup.local_batch);
  const StepContext context{setup.backend.get(), false, deck.run.seed, 0, nullptr, 0};
  const EvalMetrics metrics =
      evaluate_split(data, *setup.model, *setup.backend, device, task, setup.local_batch, context, mpi);
  if (mpi.is_root()) {
    const std::string counted = data.holds_tokens() ? std::to_string(metrics.samples) + " windows, " +
                                                          std::to_string(metrics.positions) + " positions scored"
                                                    : std::to_string(metrics.samples) + " samples";
    std::printf("%s on %s (%s): %s\n", arguments.checkpoint.c_str(), arguments.data.c_str(), counted.c_str(),
                describe(metrics).c_str());
    if (!arguments.output.empty()) {
      MetricsWriter writer(arguments.output);
      std::vector<std::pair<std::string, MetricKind>> columns{{"samples", MetricKind::int64},
                                                              {"loss", MetricKind::float64}};
      std::vector<double> row{static_cast<double>(metrics.samples), metrics.loss};
      if (data.holds_tokens()) {
        columns.emplace_back("positions", MetricKind::int64);
        row.push_back(static_cast<double>(metrics.positions));
      }
      for (const auto& [name, value] : {std::pair<const char*, double>{"accuracy", metrics.accuracy},
                                        {"top5_accuracy", metrics.top5_accuracy},
                                        {"mae", metrics.mae},
                                        {"mse", metrics.mse},
                                        {"r2", metrics.r2}})
        if (!std::isnan(value)) {
          columns.emplace_back(name, MetricKind::float64);
          row.push_back(value);
        }
      writer.define("eval", columns);
      writer.append("eval", row);
      writer.set_attribute("checkpoint", arguments.checkpoint);
      writer.set_attribute("data", arguments.data);
    }
  }
  return 0;
}

}  // namespace hpctrain
