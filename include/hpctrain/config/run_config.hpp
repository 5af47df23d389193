// The typed, validated form of an input deck (TOML). Every key a deck may contain is a field here;
// docs/input-reference.md lists each with its type, default and meaning, and a test checks the two against each other.
// Enumerated keys are enums and structured ones typed values (config/choices.hpp): the rest of the program never reads
// a deck word.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hpctrain/config/choices.hpp"

namespace hpctrain {

// Where a key was written, for error messages ("deck.toml:12:5").
struct SourcePosition {
  int line = 0;
  int column = 0;
};

struct LayerSpec {
  LayerType type = LayerType::linear;
  std::string name;      // unique; default "<type><index>" e.g. "linear0"
  std::int64_t out = 0;  // linear: output features; conv: output channels (required)
  std::int64_t in = 0;   // linear: expected input features; 0 = inferred from the previous layer or the data
  bool bias = true;      // linear, conv
  std::string tie;       // linear: the name of an embedding layer whose table is this layer's weight (GPT-2's LM head)
  double p = 0.5;        // dropout probability
  double negative_slope = 0.01;                             // leaky_relu
  GeluApproximation approximate = GeluApproximation::none;  // gelu
  double eps = 1e-5;                                        // layernorm, groupnorm
  // conv and pooling windows: one value for every spatial axis, or one per axis ((H, W) or (D, H, W)).
  std::vector<std::int64_t> kernel;          // required
  std::vector<std::int64_t> stride;          // default: 1 (conv), the kernel (pooling); filled in by the parser
  std::vector<std::int64_t> padding = {0};   // zeros added on both sides of each axis
  std::vector<std::int64_t> dilation = {1};  // conv: spacing of the kernel taps
  std::int64_t groups = 1;                   // conv: channel groups; groupnorm: number of groups (required)
  std::int64_t vocabulary = 0;               // embedding: number of token ids (required)
  bool positions = false;                    // embedding, to_sequence: a learned position embedding added
  bool class_token = false;                  // to_sequence: a learned vector prepended as position 0 (ViT's [CLS])
  std::int64_t heads = 0;                    // attention: number of heads (required), dividing C
  bool causal = true;                        // attention: position t attends to positions <= t only
  double dropout = 0.0;           // attention, transformer_block: dropout on the attention probabilities (attn_pdrop)
  double residual_dropout = 0.0;  // transformer_block: dropout at the end of each residual branch (resid_pdrop)
  // residual: the branch, run on the block's input and added to it (output = input + branch(input)); required, not
  // empty, no residual inside. Its layers' names are their own (unique within the block); the model calls them
  // "<block name>.<layer name>" (see Model).
  std::vector<LayerSpec> layers;
  std::int64_t mlp_ratio = 4;                      // transformer_block: the MLP's hidden width over C (GPT-2: 4)
  SequencePoolMode mode = SequencePoolMode::mean;  // sequence_pool: (T, C) -> (C) by the mean or the first position
  SourcePosition position;                         // of the layer's table in the deck
};

struct RunSection {
  std::uint64_t seed = 0;
  std::string output;  // default: runs/<deck file stem>
  Device device = Device::cpu;
  std::int64_t threads = 0;  // per rank; 0 = cores available to the rank / ranks on its node (OMP_NUM_THREADS wins)
  bool cuda_graphs = false;  // CUDA: capture the step into a CUDA graph after warm-up and replay it
};

struct ModelSection {
  std::vector<LayerSpec> layers;
  LossKind loss = LossKind::cross_entropy;
  // cross_entropy only (PyTorch's CrossEntropyLoss(weight, label_smoothing)): one positive weight per class (empty:
  // every class weighs 1; the mean then divides by the global batch's sum of its labels' weights), and the share of
  // each target spread evenly over all classes.
  std::vector<double> class_weights;
  double label_smoothing = 0.0;
  InitScheme init = InitScheme::pytorch;  // pytorch: each layer's PyTorch default; gpt2: GPT-2's normal(0, 0.02) scheme
};

struct DataSection {
  std::vector<std::string> train;       // HDF5 files or glob patterns, read as one dataset (required)
  std::vector<std::string> validation;  // the same for the validation set (optional; empty = none)
  std::string features = "/features";   // (N, F), (N, C, H, W), (N, C, D, H, W): the sample shape the model reads
  std::string labels = "/labels";       // cross_entropy: integer class labels (N)
  std::string targets = "/targets";     // mse: float targets (N x K)
  // Token data (a file with /tokens, docs/file-formats.md): the window length T of a sample (T input tokens, T targets
  // shifted by one); 0 = the files' sequence_length attribute.
  std::int64_t sequence_length = 0;
  std::int64_t batch_size = 64;               // global batch over all ranks
  std::int64_t eval_batch_size = 0;           // global; 0 = batch_size
  ShuffleMode shuffle = ShuffleMode::global;  // TOML true | false | "local" (each rank within its own slice)
  bool drop_last = false;
  std::int64_t prefetch = 2;  // batches read ahead by a background thread; 0 = read in next()
  bool in_memory = false;     // load the rank's share once (global/none: the whole split) instead of reading per batch
  bool huge_pages = false;    // stage data in memory on transparent huge pages (core/staged_array.hpp)
  // Applied to the features on load, in this order: log1p (if set), then multiply by scale, then add shift.
  bool log1p = false;
  double scale = 1.0;
  double shift = 0.0;
  // Standardisation, after the transforms above: (x - mean[c]) / std[c] with one value per channel c (the second
  // dimension of the features). data.normalize names a file `hpctrain data inspect --stats-out` wrote; train reads it
  // into mean/std and records the values (not the file name) in OUTPUT/config.toml, so checkpoints carry them.
  std::string normalize;
  std::vector<double> mean;
  std::vector<double> std;
  std::string normalized_from;  // not a deck key: the file data.normalize named, for messages
  // Augmentation of the training split's images and volumes (data/augmentation.hpp): random flips of every spatial
  // axis, a random crop of the original extent after padding each side by augment_crop_padding (0 = none), a random
  // multiple of 90 degrees in the plane of the last two axes.
  bool augment_flip = false;
  std::int64_t augment_crop_padding = 0;
  bool augment_rot90 = false;
};

struct TrainSection {
  std::int64_t steps = 0;  // optimizer steps; exactly one of steps/epochs must be set
  std::int64_t epochs = 0;
  std::int64_t log_every = 10;
  std::int64_t eval_every = 0;         // 0 = evaluate only at the end (or by epochs)
  std::int64_t eval_every_epochs = 0;  // the same in epochs; at most one of the two is set
  bool profile = false;                // print the time per phase of the step at the end (--profile)
  TimeLimit time_limit;         // "HH:MM:SS" wall-clock budget: checkpoint and stop before it runs out; "" = none
  std::int64_t accumulate = 1;  // micro-batches per optimizer step (gradient accumulation)
  // Stop after this many evaluations in a row without improvement of checkpoint.best_metric; 0 = never.
  std::int64_t early_stopping_patience = 0;
  double early_stopping_min_delta = 0.0;  // an improvement beats the best by more than this (best checkpoint too)
};

struct OptimizerSection {
  OptimizerKind type = OptimizerKind::adamw;
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double momentum = 0.0;
  bool nesterov = false;
  double grad_clip = 0.0;  // max global gradient norm; 0 = no clipping
  // Parameters whose name contains one of these words get no weight decay ("bias" matches every bias; "norm" every
  // parameter of a normalisation layer, by layer type).
  std::vector<std::string> no_decay = {"bias", "norm"};
};

struct CheckpointSection {
  std::int64_t every_steps = 0;   // 0 = not by step count
  std::int64_t every_epochs = 0;  // the same in epochs; at most one of the two is set
  // At least one checkpoint per this many seconds (decided on rank 0, agreed by all); 0 (or false) = not by time. On by
  // default, so that a crash loses at most half an hour.
  double every_seconds = 1800.0;
  std::int64_t keep = 3;  // newest checkpoints kept; 0 = keep all
  bool at_end = true;     // write one when training finishes
  std::vector<CheckpointSignal> on_signal = {CheckpointSignal::usr1, CheckpointSignal::usr2,
                                             CheckpointSignal::term};  // checkpoint and exit on these signals
  BestMetric best_metric = BestMetric::none;  // keep checkpoints/best by this validation metric; none = no best
};

struct ScheduleSection {
  ScheduleKind type = ScheduleKind::constant;
  std::int64_t warmup_steps = 0;  // linear warm-up from 0 (all types)
  double min_lr = 0.0;            // cosine: final learning rate
  std::int64_t step_size = 1000;  // step: decay every step_size steps
  double gamma = 0.1;             // step: decay factor
};

struct PrecisionSection {
  PrecisionMode mode = PrecisionMode::fp32;
  LossScaleSetting loss_scale = AutoLossScale{};
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  std::int64_t max_skipped_steps = 100;  // consecutive skipped steps before the run stops
  bool tf32 = false;  // CUDA: fp32 products and convolutions on tensor cores (TF32 inputs, fp32 accumulation)
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainSection train;
  OptimizerSection optimizer;
  ScheduleSection schedule;
  PrecisionSection precision;
  CheckpointSection checkpoint;

  std::string deck_path;                            // as given on the command line
  std::map<std::string, SourcePosition> positions;  // "section.key" -> where it was written

  // "deck.toml:12:5" for a key (or just the file name when the key came from a default or --set).
  [[nodiscard]] std::string where(const std::string& dotted_key) const;
};

// Parse and validate a deck; overrides are "section.key=value" strings from --set (value parsed as TOML, bare words as
// strings). Throws InputError with file:line:column, the key, and what to do.
RunConfig load_run_config(const std::string& deck_path, const std::vector<std::string>& overrides = {});
RunConfig parse_run_config(const std::string& deck_text, const std::string& deck_path,
                           const std::vector<std::string>& overrides = {});

// A transformer_block (GPT-2's pre-LayerNorm block) on a sequence of width C, as the two residual blocks it stands for:
// residual[layernorm ln_1, attention attn (heads, causal, dropout)] and residual[layernorm ln_2, linear c_fc
// (mlp_ratio x C), gelu (tanh), linear c_proj (C)], both named after the block (so the model calls their layers
// <block>.ln_1, <block>.attn, ... as GPT-2 names h.0.ln_1, h.0.attn). The model expands it where C is known.
std::vector<LayerSpec> expand_transformer_block(const LayerSpec& block, std::int64_t width);

// The resolved deck as TOML (every key, defaults filled in), written to OUTPUT/config.toml.
std::string to_toml(const RunConfig& config);

// Every dotted key the parser accepts ("run.seed", "model.layers[].out", ...), for the documentation test.
std::vector<std::string> accepted_keys();

}  // namespace hpctrain
