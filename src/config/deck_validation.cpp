// Validating a deck once read: enumerated words, ranges, layers, relations between keys; defaults that depend on the
// deck; data paths.
#include <glob.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "deck_reader.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/suggestions.hpp"
#include "toml_text.hpp"

namespace hpctrain::deck {

int DeckReader::word_index(const std::string& dotted_key, const std::string& value,
                           std::span<const std::string_view> allowed) const {
  if (const auto found = std::find(allowed.begin(), allowed.end(), value); found != allowed.end())
    return static_cast<int>(found - allowed.begin());
  std::vector<Suggestion> candidates;
  for (const auto word : allowed) candidates.push_back({std::string(word), std::string(word)});
  // Other names for our values; spelling distance alone would suggest "cpu" for "gpu".
  static const std::vector<std::pair<std::string_view, std::string_view>> synonyms = {{"gpu", "cuda"},
                                                                                      {"float32", "fp32"},
                                                                                      {"float", "fp32"},
                                                                                      {"bfloat16", "bf16"},
                                                                                      {"float16", "fp16"},
                                                                                      {"half", "fp16"},
                                                                                      {"adam", "adamw"},
                                                                                      {"ce", "cross_entropy"},
                                                                                      {"l2", "mse"},
                                                                                      {"cos", "cosine"},
                                                                                      {"layer_norm", "layernorm"},
                                                                                      {"leakyrelu", "leaky_relu"},
                                                                                      {"fully_connected", "linear"},
                                                                                      {"dense", "linear"}};
  for (const auto& [other_name, word] : synonyms)
    if (lowercase(value) == other_name && std::find(allowed.begin(), allowed.end(), word) != allowed.end())
      candidates.insert(candidates.begin(), {std::string(word), std::string(value)});
  fail(location(dotted_key),
       dotted_key + " must be one of " + join(allowed) + " (got " + toml_string(value) + ")" +
           did_you_mean(closest_name(value, candidates)),
       "set " + dotted_key + " to one of: " + join(allowed));
}

LossScaleSetting DeckReader::loss_scale_of(const std::string& dotted_key, const std::string& text) const {
  if (text == "auto") return AutoLossScale{};
  if (text == "dynamic") return DynamicLossScale{};
  if (text == "none") return NoLossScale{};
  const auto number = parse_number_text(text);
  // Scales are applied in fp32, so a fixed scale must be a positive fp32 value.
  if (!number || *number <= 0 || *number > largest_float) {
    std::vector<Suggestion> candidates;
    for (const auto word : loss_scale_words) candidates.push_back({std::string(word), std::string(word)});
    fail(location(dotted_key),
         "precision.loss_scale must be auto, dynamic, none or a positive number up to 3.4028235e+38 (got " +
             toml_string(text) + ")" + (number ? "" : did_you_mean(closest_name(text, candidates))),
         "auto means dynamic for fp16 and none otherwise; a number is a fixed scale, e.g. loss_scale = 1024");
  }
  return FixedLossScale{*number};
}

TimeLimit DeckReader::time_limit_of(const std::string& dotted_key, const std::string& text) const {
  if (text.empty()) return {};
  const auto seconds = time_limit_seconds(text);
  if (!seconds)
    range_error(dotted_key, "\"HH:MM:SS\", \"MM:SS\" (minutes and seconds below 60, more than zero in all) or \"\"",
                toml_string(text), "e.g. time_limit = \"11:50:00\"; \"\" means no limit");
  return TimeLimit{static_cast<double>(*seconds), text};
}

void DeckReader::check_integer(const std::string& dotted_key, std::int64_t value, std::int64_t minimum,
                               std::int64_t maximum) const {
  if (value >= minimum && value <= maximum) return;
  const std::string rule = value < minimum ? ">= " + std::to_string(minimum) : "<= " + std::to_string(maximum);
  range_error(dotted_key, rule, std::to_string(value), "use an integer " + rule + default_hint(dotted_key));
}

void DeckReader::check_number(const std::string& dotted_key, double value, bool ok, const std::string& rule) const {
  if (ok) return;
  range_error(dotted_key, rule, shortest_number_text(value), "use a value " + rule + default_hint(dotted_key));
}

std::string DeckReader::default_hint(const std::string& dotted_key) const {
  const auto dot = dotted_key.find('.');
  if (dotted_key.rfind("model.layers[", 0) == 0) {
    const auto* field = find_layer_field(dotted_key.substr(dotted_key.rfind('.') + 1));
    return field ? " (default " + default_literal(*field) + ")" : std::string{};
  }
  const SectionSpec* section = find_section(dotted_key.substr(0, dot));
  const FieldSpec* field = section ? find_field(*section, dotted_key.substr(dot + 1)) : nullptr;
  return field ? " (default " + default_literal(section->name, *field) + ")" : std::string{};
}

void DeckReader::validate() {
  const RunConfig& config = config_;
  check_integer("run.threads", config.run.threads, 0);
  if (override_for("run.output") || config.positions.count("run.output"))
    if (config.run.output.empty())
      range_error("run.output", "a directory path", "an empty string", "leave run.output out to get runs/<deck name>");

  validate_layers();
  validate_loss();

  if (std::all_of(config.data.train.begin(), config.data.train.end(), [](const auto& f) { return f.empty(); }))
    fail(location("data.train"), "data.train is missing: the training data file is required",
         "add under [data]: train = \"path/to/train.h5\" (relative paths are resolved as described in "
         "docs/input-reference.md)");
  for (const std::string key : {"data.features", "data.labels", "data.targets"}) {
    const std::string& value = key == "data.features" ? config.data.features
                               : key == "data.labels" ? config.data.labels
                                                      : config.data.targets;
    if (value.empty())
      range_error(key, "an HDF5 dataset path", "an empty string", "use a dataset path such as \"/features\"");
  }
  check_integer("data.batch_size", config.data.batch_size, 1);
  check_integer("data.eval_batch_size", config.data.eval_batch_size, 0);
  check_integer("data.prefetch", config.data.prefetch, 0);
  check_integer("data.augment_crop_padding", config.data.augment_crop_padding, 0);
  check_integer("data.sequence_length", config.data.sequence_length, 0);
  check_number("data.scale", config.data.scale, config.data.scale != 0, "a non-zero number");
  if (config.data.mean.size() != config.data.std.size())
    fail(location(config.data.mean.empty() ? "data.std" : "data.mean"),
         "data.mean has " + std::to_string(config.data.mean.size()) + " values but data.std has " +
             std::to_string(config.data.std.size()) + ": standardisation needs one mean and one std per channel",
         "set both, or use data.normalize = \"stats.h5\" (written by hpctrain data inspect --stats-out)");
  if (!config.data.normalize.empty() && !config.data.mean.empty())
    fail(location("data.normalize"), "data.normalize and data.mean/data.std are both set: choose one",
         "data.normalize reads the values from a file; data.mean and data.std give them in the deck");
  for (std::size_t c = 0; c < config.data.std.size(); ++c)
    if (!(config.data.std[c] > 0))
      fail(location("data.std"),
           "data.std[" + std::to_string(c) + "] is " + toml_float(config.data.std[c]) +
               ": a standard deviation must be positive (a constant channel cannot be standardised)",
           "use 1 for a constant channel (then only its mean is subtracted), or drop the channel");

  check_integer("train.steps", config.train.steps, 0);
  check_integer("train.epochs", config.train.epochs, 0);
  if (config.train.steps == 0 && config.train.epochs == 0) {
    const std::string where =
        location(config.positions.count("train.steps") || override_for("train.steps")     ? "train.steps"
                 : config.positions.count("train.epochs") || override_for("train.epochs") ? "train.epochs"
                                                                                          : "train");
    fail(where, "train.steps and train.epochs are both 0: set exactly one of them to a positive number",
         "add under [train]: steps = 1000 (optimizer steps) or epochs = 10 (passes over data.train)");
  }
  if (config.train.steps > 0 && config.train.epochs > 0) {
    const std::string key = override_for("train.steps") ? "train.steps" : "train.epochs";
    fail(location(key),
         "train.steps (" + std::to_string(config.train.steps) + ") and train.epochs (" +
             std::to_string(config.train.epochs) + ") are both set: set exactly one of them",
         "remove one of them (or set it to 0, e.g. --set train.epochs=0)");
  }
  check_integer("train.log_every", config.train.log_every, 1);
  check_integer("train.eval_every", config.train.eval_every, 0);
  check_integer("train.accumulate", config.train.accumulate, 1);

  const CheckpointSection& checkpoint = config.checkpoint;
  check_integer("checkpoint.every_steps", checkpoint.every_steps, 0);
  check_number("checkpoint.every_seconds", checkpoint.every_seconds, checkpoint.every_seconds >= 0, ">= 0");
  check_integer("checkpoint.keep", checkpoint.keep, 0);
  validate_intervals_and_best();

  const OptimizerSection& optimizer = config.optimizer;
  check_number("optimizer.lr", optimizer.lr, optimizer.lr > 0, "> 0");
  check_number("optimizer.weight_decay", optimizer.weight_decay, optimizer.weight_decay >= 0, ">= 0");
  check_number("optimizer.beta1", optimizer.beta1, optimizer.beta1 >= 0 && optimizer.beta1 < 1, "in [0, 1)");
  check_number("optimizer.beta2", optimizer.beta2, optimizer.beta2 >= 0 && optimizer.beta2 < 1, "in [0, 1)");
  check_number("optimizer.eps", optimizer.eps, optimizer.eps > 0, "> 0");
  check_number("optimizer.momentum", optimizer.momentum, optimizer.momentum >= 0, ">= 0");
  check_number("optimizer.grad_clip", optimizer.grad_clip, optimizer.grad_clip >= 0, ">= 0");
  if (optimizer.type == OptimizerKind::sgd && optimizer.nesterov && optimizer.momentum == 0)
    fail(location("optimizer.nesterov"), "optimizer.nesterov = true needs optimizer.momentum > 0 (it is 0)",
         "set optimizer.momentum, e.g. momentum = 0.9, or remove nesterov");

  const ScheduleSection& schedule = config.schedule;
  check_integer("schedule.warmup_steps", schedule.warmup_steps, 0);
  check_number("schedule.min_lr", schedule.min_lr, schedule.min_lr >= 0, ">= 0");
  if (schedule.type == ScheduleKind::cosine && schedule.min_lr > optimizer.lr)
    fail(location("schedule.min_lr"),
         "schedule.min_lr (" + shortest_number_text(schedule.min_lr) + ") is larger than optimizer.lr (" +
             shortest_number_text(optimizer.lr) + "): a cosine schedule decays from lr down to min_lr",
         "use a schedule.min_lr <= optimizer.lr");
  check_integer("schedule.step_size", schedule.step_size, 1);
  check_number("schedule.gamma", schedule.gamma, schedule.gamma > 0, "> 0");

  const PrecisionSection& precision = config.precision;
  check_number("precision.init_scale", precision.init_scale,
               precision.init_scale > 0 && precision.init_scale <= largest_float, "in (0, 3.4028235e+38]");
  check_number("precision.growth_factor", precision.growth_factor, precision.growth_factor > 1, "> 1");
  check_number("precision.backoff_factor", precision.backoff_factor,
               precision.backoff_factor > 0 && precision.backoff_factor < 1, "in (0, 1)");
  check_integer("precision.growth_interval", precision.growth_interval, 1);
  check_integer("precision.max_skipped_steps", precision.max_skipped_steps, 1);
}

void DeckReader::validate_loss() {
  const ModelSection& model = config_.model;
  const bool weights_set = !model.class_weights.empty(), smoothing_set = model.label_smoothing != 0.0;
  if (model.loss != LossKind::cross_entropy && (weights_set || smoothing_set)) {
    const std::string key = weights_set ? "model.class_weights" : "model.label_smoothing";
    fail(location(key),
         key + " is set but model.loss = \"" + std::string(word_of(model.loss)) +
             "\": class weights and label smoothing apply to the cross-entropy only",
         "remove " + key + ", or use model.loss = \"cross_entropy\" (integer class labels)");
  }
  check_number("model.label_smoothing", model.label_smoothing, model.label_smoothing >= 0 && model.label_smoothing < 1,
               "in [0, 1)");
  for (std::size_t c = 0; c < model.class_weights.size(); ++c)
    if (!(model.class_weights[c] > 0) || !std::isfinite(model.class_weights[c]))
      fail(location("model.class_weights"),
           "model.class_weights[" + std::to_string(c) + "] is " + toml_float(model.class_weights[c]) +
               ": a class weight must be a positive finite number",
           "give one positive weight per class, e.g. the inverse of each class's frequency (1 = unweighted)");
}

void DeckReader::validate_intervals_and_best() {
  const RunConfig& config = config_;
  check_integer("train.eval_every_epochs", config.train.eval_every_epochs, 0);
  check_integer("checkpoint.every_epochs", config.checkpoint.every_epochs, 0);
  for (const auto& [steps_key, steps, epochs_key, epochs] :
       {std::tuple<std::string, std::int64_t, std::string, std::int64_t>{
            "train.eval_every", config.train.eval_every, "train.eval_every_epochs", config.train.eval_every_epochs},
        {"checkpoint.every_steps", config.checkpoint.every_steps, "checkpoint.every_epochs",
         config.checkpoint.every_epochs}})
    if (steps > 0 && epochs > 0)
      fail(location(override_for(steps_key) ? steps_key : epochs_key),
           steps_key + " (" + std::to_string(steps) + ") and " + epochs_key + " (" + std::to_string(epochs) +
               ") are both set: give the interval in steps or in epochs",
           "remove one of them (or set it to 0, e.g. --set " + steps_key + "=0)");

  const BestMetric metric = config.checkpoint.best_metric;
  const bool classification = config.model.loss == LossKind::cross_entropy;
  const std::vector<BestMetric> computed =
      classification ? std::vector<BestMetric>{BestMetric::loss, BestMetric::accuracy, BestMetric::top5_accuracy}
                     : std::vector<BestMetric>{BestMetric::loss, BestMetric::mae, BestMetric::mse, BestMetric::r2};
  std::vector<std::string_view> computed_words;
  for (const BestMetric each : computed) computed_words.push_back(word_of(each));
  if (metric != BestMetric::none && std::find(computed.begin(), computed.end(), metric) == computed.end())
    fail(location("checkpoint.best_metric"),
         "checkpoint.best_metric = \"" + std::string(word_of(metric)) + "\" is not computed by a model.loss = \"" +
             std::string(word_of(config.model.loss)) + "\" run: its validation metrics are " + join(computed_words),
         "use one of: " + join(computed_words) + " (or \"none\")");
  const auto& validation = config.data.validation;
  if (metric != BestMetric::none &&
      std::all_of(validation.begin(), validation.end(), [](const std::string& file) { return file.empty(); }))
    fail(location("checkpoint.best_metric"),
         "checkpoint.best_metric = \"" + std::string(word_of(metric)) +
             "\" needs a validation set, and data.validation is empty",
         "set data.validation = \"path/to/validation.h5\" ('hpctrain data split' carves one out of the training file), "
         "or remove checkpoint.best_metric");

  const TrainSection& train = config.train;
  check_integer("train.early_stopping_patience", train.early_stopping_patience, 0);
  check_number("train.early_stopping_min_delta", train.early_stopping_min_delta, train.early_stopping_min_delta >= 0,
               ">= 0");
  for (const auto& [key, set] :
       {std::pair<std::string, bool>{"train.early_stopping_patience", train.early_stopping_patience > 0},
        {"train.early_stopping_min_delta", train.early_stopping_min_delta > 0}})
    if (set && metric == BestMetric::none)
      fail(location(key), key + " is set but checkpoint.best_metric is \"none\": there is no metric to watch",
           "set checkpoint.best_metric, e.g. best_metric = \"" + std::string(classification ? "accuracy" : "loss") +
               "\" under [checkpoint]");
  if (train.early_stopping_patience > 0 && train.eval_every == 0 && train.eval_every_epochs == 0)
    fail(location("train.early_stopping_patience"),
         "train.early_stopping_patience = " + std::to_string(train.early_stopping_patience) +
             " counts evaluations, but the run evaluates only at the end",
         "set train.eval_every (steps) or train.eval_every_epochs");
}

void DeckReader::validate_layers() {
  auto& layers = config_.model.layers;
  if (layers.empty())
    fail(
        location("model.layers"),
        "model.layers is " +
            std::string(config_.positions.count("model.layers") || override_for("model.layers") ? "empty" : "missing") +
            ": the model needs at least one layer",
        "add layers, for example:\n[[model.layers]]\ntype = \"linear\"\nout = 64\n\n[[model.layers]]\ntype = "
        "\"relu\"");
  validate_layer_list(layers, "model.layers", "");
}

void DeckReader::validate_layer_list(std::vector<LayerSpec>& layers, const std::string& list_key,
                                     const std::string& block_key) {
  std::map<std::string, std::size_t> index_by_name;
  for (std::size_t index = 0; index < layers.size(); ++index) {
    LayerSpec& layer = layers[index];
    const std::string table_key = layer_table_key(list_key, index);
    const auto key_of = [&](std::string_view key) { return dotted_layer_key(table_key, key); };
    const auto& given = layer_keys_given_[table_key];
    const auto has = [&](std::string_view key) { return std::find(given.begin(), given.end(), key) != given.end(); };
    if (!has("type"))
      fail(location(table_key), table_key + " has no type",
           "add type = \"...\" with one of: " + join(choice_words<LayerType>()));
    const std::string type_word(word_of(layer.type));  // checked when read
    const LayerTypeSpec* type = find_layer_type(layer.type);

    for (const auto& key : given) {
      if (layer_type_accepts(*type, key)) continue;
      std::vector<std::string_view> owners;
      for (const auto& other : layer_types())
        if (layer_type_accepts(other, key)) owners.push_back(word_of(other.type));
      std::vector<std::string_view> accepted = {"type", "name"};
      accepted.insert(accepted.end(), type->keys.begin(), type->keys.end());
      fail(location(key_of(key)),
           key_of(key) + " does not apply to a " + type_word + " layer (" + key + " is for " + join(owners, " and ") +
               " layers)",
           "remove it; a " + type_word + " layer takes: " + join(accepted));
    }
    if (layer.type == LayerType::linear) {
      const bool has_out = has("out");
      if (!has_out && layer.tie.empty())  // a tied head's out is its embedding's vocabulary (validate_ties)
        fail(location(table_key), table_key + " (linear) needs out, its number of output features",
             "add out = <number of output features>, e.g. out = 64");
      if (has_out) check_integer(key_of("out"), layer.out, 1);
      check_integer(key_of("in"), layer.in, 0);
    }
    if (layer.type == LayerType::embedding) {
      for (const auto& [key, what] : {std::pair{"vocabulary", "the number of token ids (256 for bytes)"},
                                      std::pair{"out", "the width of each token's vector"}})
        if (!has(key))
          fail(location(table_key), table_key + " (embedding) needs " + key + ", " + what,
               std::string("add ") + key + " = <number>, e.g. " + key + " = " +
                   (std::string_view(key) == "out" ? "64" : "256"));
      check_integer(key_of("vocabulary"), layer.vocabulary, 1);
      check_integer(key_of("out"), layer.out, 1);
    }
    if (layer.type == LayerType::attention || layer.type == LayerType::transformer_block) {
      if (!has("heads"))
        fail(location(table_key), table_key + " (" + type_word + ") needs heads, its number of heads",
             "add heads = <number dividing the width C>, e.g. heads = 4");
      check_integer(key_of("heads"), layer.heads, 1);
      check_number(key_of("dropout"), layer.dropout, layer.dropout >= 0 && layer.dropout < 1, "in [0, 1)");
    }
    if (layer.type == LayerType::dropout) check_number(key_of("p"), layer.p, layer.p >= 0 && layer.p < 1, "in [0, 1)");
    if (layer.type == LayerType::layernorm || layer.type == LayerType::groupnorm)
      check_number(key_of("eps"), layer.eps, layer.eps > 0, "> 0");
    validate_spatial_layer(table_key, layer, given);
    if (layer.type == LayerType::transformer_block) {
      check_integer(key_of("mlp_ratio"), layer.mlp_ratio, 1);
      check_number(key_of("residual_dropout"), layer.residual_dropout,
                   layer.residual_dropout >= 0 && layer.residual_dropout < 1, "in [0, 1)");
      if (!block_key.empty())
        fail(location(table_key),
             table_key + " is a transformer_block (two residual blocks) inside the residual block " + block_key +
                 ": nested residual blocks are not supported yet",
             "move it out of " + block_key);
    }
    if (layer.type == LayerType::residual) {
      if (!block_key.empty())
        fail(location(table_key),
             table_key + " is a residual block inside the residual block " + block_key +
                 ": nested residual blocks are not supported yet",
             "move it out of " + block_key + "; residual blocks may follow one another");
      if (layer.layers.empty())
        fail(location(has("layers") ? key_of("layers") : table_key),
             table_key + " (residual) has " + (has("layers") ? "an empty branch" : "no layers") +
                 ": a residual block adds the output of its layers to its input",
             "add the branch, e.g. layers = " + example_literal("model.layers[].layers", "") +
                 " (the branch must give the shape it receives)");
      validate_layer_list(layer.layers, key_of("layers"), table_key);
    }

    if (!has("name")) {
      layer.name = type_word + std::to_string(index);
    } else if (layer.name.empty() ||
               layer.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                   std::string::npos) {
      range_error(key_of("name"), "made of letters, digits, _ and -", toml_string(layer.name),
                  "names label the layer's parameters in logs and checkpoints; e.g. name = \"encoder_1\"");
    }
    const auto [existing, inserted] = index_by_name.emplace(layer.name, index);
    if (!inserted) {
      const std::string first = layer_table_key(list_key, existing->second);
      fail(location(has("name") ? key_of("name") : table_key),
           "duplicate layer name '" + layer.name + "': " + table_key + " and " + first + " (" + location(first) +
               ") both use it",
           block_key.empty()
               ? "give every layer a unique name; a layer without a name is called <type><index>, e.g. linear0"
               : "give every layer of the block a unique name; a layer without a name is called <type><index in "
                 "the block>, e.g. linear0");
    }
  }
  validate_ties(index_by_name);
}

// linear's tie: the name of an embedding whose table (vocabulary, width) becomes the layer's weight, so the layer has
// one output per token id (its out, given or not). The width is checked by the model, which knows the layer's input.
void DeckReader::validate_ties(const std::map<std::string, std::size_t>& index_by_name) {
  auto& layers = config_.model.layers;
  for (std::size_t index = 0; index < layers.size(); ++index) {
    LayerSpec& layer = layers[index];
    if (layer.type != LayerType::linear || layer.tie.empty()) continue;
    const std::string key = layer_key(index, "tie");
    const auto found = index_by_name.find(layer.tie);
    std::string embeddings;
    for (const LayerSpec& other : layers)
      if (other.type == LayerType::embedding) embeddings += (embeddings.empty() ? "'" : ", '") + other.name + "'";
    const std::string what_to_do =
        embeddings.empty() ? "remove tie: only an embedding's table can be tied, and the model has no embedding"
                           : "name an embedding layer: " + embeddings;
    if (found == index_by_name.end())
      fail(location(key), key + " = " + toml_string(layer.tie) + " names no layer of the model", what_to_do);
    const LayerSpec& embedding = layers[found->second];
    if (embedding.type != LayerType::embedding)
      fail(location(key),
           key + " = " + toml_string(layer.tie) + " names a " + std::string(word_of(embedding.type)) +
               " layer; a linear layer can tie its weight only to an embedding's table",
           what_to_do);
    const auto& given = layer_keys_given_[layer_table_key("model.layers", index)];
    if (std::find(given.begin(), given.end(), "out") == given.end()) {
      layer.out = embedding.vocabulary;
    } else if (layer.out != embedding.vocabulary) {
      fail(
          location(layer_key(index, "out")),
          layer_key(index, "out") + " = " + std::to_string(layer.out) + ", but the tied embedding '" + layer.tie +
              "' has vocabulary = " + std::to_string(embedding.vocabulary) +
              ": a tied layer has one output per row of the table",
          "set out = " + std::to_string(embedding.vocabulary) + " or remove it (a tied layer's out is the vocabulary)");
    }
  }
}

void DeckReader::validate_spatial_layer(const std::string& table_key, LayerSpec& layer,
                                        const std::vector<std::string>& given) const {
  const auto has = [&](std::string_view key) { return std::find(given.begin(), given.end(), key) != given.end(); };
  const auto key_of = [&](std::string_view key) { return dotted_layer_key(table_key, key); };
  const bool conv = is_convolution(layer.type), pool = is_window_pooling(layer.type);
  const std::string type_word(word_of(layer.type));
  if (layer.type == LayerType::groupnorm) {
    if (!has("groups"))
      fail(location(table_key), table_key + " (groupnorm) needs groups, the number of channel groups",
           "add groups = <a divisor of the channel count>, e.g. groups = 4 (1 normalises over all channels)");
    check_integer(key_of("groups"), layer.groups, 1);
    return;
  }
  if (!conv && !pool) return;
  const auto axes = static_cast<std::size_t>(window_axes(layer.type));
  if (conv) {
    if (!has("out"))
      fail(location(table_key), table_key + " (" + type_word + ") needs out, its number of output channels",
           "add out = <number of output channels>, e.g. out = 16");
    check_integer(key_of("out"), layer.out, 1);
    check_integer(key_of("groups"), layer.groups, 1);
  }
  if (!has("kernel"))
    fail(location(table_key), table_key + " (" + type_word + ") needs kernel, the window size",
         "add kernel = 3 (the same on every axis) or one value per axis, e.g. kernel = " +
             std::string(axes == 2 ? "[3, 3]" : "[3, 3, 3]"));
  if (!has("stride")) layer.stride = conv ? std::vector<std::int64_t>{1} : layer.kernel;
  for (const auto& [key, values, minimum] :
       {std::tuple<const char*, std::vector<std::int64_t>*, std::int64_t>{"kernel", &layer.kernel, 1},
        {"stride", &layer.stride, 1},
        {"padding", &layer.padding, 0},
        {"dilation", &layer.dilation, 1}}) {
    const std::string dotted = key_of(key);
    if (values->size() != 1 && values->size() != axes)
      fail(location(dotted),
           dotted + " has " + std::to_string(values->size()) + " values; a " + type_word + " layer has " +
               std::to_string(axes) + " spatial axes",
           "give one value for every axis or exactly " + std::to_string(axes) + ", e.g. " + key + " = " +
               (axes == 2 ? "[2, 2]" : "[2, 2, 2]"));
    for (const auto value : *values)
      if (value < minimum)
        range_error(dotted, ">= " + std::to_string(minimum), toml_literal(FieldRef{values}),
                    "use integers >= " + std::to_string(minimum) + default_hint(dotted));
  }
  if (pool)
    for (std::size_t axis = 0; axis < axes; ++axis) {
      const auto at = [axis](const std::vector<std::int64_t>& values) {
        return values.size() == 1 ? values[0] : values[axis];
      };
      if (2 * at(layer.padding) > at(layer.kernel))
        fail(location(key_of("padding")),
             key_of("padding") + " (" + std::to_string(at(layer.padding)) + ") is more than half the kernel (" +
                 std::to_string(at(layer.kernel)) + "): some windows would hold only padding",
             "use padding <= kernel / 2, as PyTorch requires");
    }
}

std::string DeckReader::resolve_data_path(const std::string& path) const {
  namespace fs = std::filesystem;
  if (path.empty()) return path;
  const fs::path given(path);
  if (given.is_absolute()) return given.lexically_normal().string();
  std::error_code error;
  bool here = false;
  if (path.find_first_of("*?[") != std::string::npos) {  // a glob pattern (see data/data_files.hpp)
    glob_t matches{};
    here = glob(path.c_str(), 0, nullptr, &matches) == 0 && matches.gl_pathc > 0;
    globfree(&matches);
  } else {
    here = fs::exists(given, error);
  }
  if (here) return fs::absolute(given, error).lexically_normal().string();
  return fs::absolute(fs::path(deck_path_).parent_path() / given, error).lexically_normal().string();
}

void DeckReader::resolve_data_paths(std::vector<std::string>& paths) const {
  std::erase(paths, std::string());
  for (auto& path : paths) path = resolve_data_path(path);
}

void DeckReader::fill_defaults_and_resolve_paths() {
  if (config_.run.output.empty()) {
    std::string stem = std::filesystem::path(deck_path_).stem().string();
    config_.run.output = "runs/" + (stem.empty() ? std::string("deck") : stem);
  }
  resolve_data_paths(config_.data.train);
  resolve_data_paths(config_.data.validation);
}

}  // namespace hpctrain::deck
