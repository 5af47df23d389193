// Tests of the input-deck parser (src/config/run_config.cpp): values and defaults, the resolved deck round trip, data
// path resolution, and that docs/input-reference.md documents exactly the keys the parser accepts. Its errors and
// --set overrides: run_config_errors_test.cpp.
#include "hpctrain/config/run_config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "run_config_test_support.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;
using namespace deck_test;

// Every field of two configs (positions and deck_path aside), so a round trip cannot lose a key unnoticed.
void expect_same_values(const RunConfig& a, const RunConfig& b) {
  EXPECT_EQ(a.run.seed, b.run.seed);
  EXPECT_EQ(a.run.output, b.run.output);
  EXPECT_EQ(a.run.device, b.run.device);
  EXPECT_EQ(a.run.threads, b.run.threads);
  EXPECT_EQ(a.model.loss, b.model.loss);
  EXPECT_EQ(a.model.class_weights, b.model.class_weights);
  EXPECT_EQ(a.model.label_smoothing, b.model.label_smoothing);
  ASSERT_EQ(a.model.layers.size(), b.model.layers.size());
  for (std::size_t i = 0; i < a.model.layers.size(); ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    const LayerSpec &x = a.model.layers[i], &y = b.model.layers[i];
    EXPECT_EQ(x.type, y.type);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.out, y.out);
    EXPECT_EQ(x.in, y.in);
    EXPECT_EQ(x.bias, y.bias);
    EXPECT_EQ(x.p, y.p);
    EXPECT_EQ(x.negative_slope, y.negative_slope);
    EXPECT_EQ(x.approximate, y.approximate);
    EXPECT_EQ(x.eps, y.eps);
    EXPECT_EQ(x.vocabulary, y.vocabulary);
    EXPECT_EQ(x.positions, y.positions);
    EXPECT_EQ(x.class_token, y.class_token);
    EXPECT_EQ(x.heads, y.heads);
    EXPECT_EQ(x.causal, y.causal);
    EXPECT_EQ(x.dropout, y.dropout);
    EXPECT_EQ(x.residual_dropout, y.residual_dropout);
    ASSERT_EQ(x.layers.size(), y.layers.size());  // a residual's branch
    for (std::size_t j = 0; j < x.layers.size(); ++j) {
      EXPECT_EQ(x.layers[j].type, y.layers[j].type);
      EXPECT_EQ(x.layers[j].name, y.layers[j].name);
      EXPECT_EQ(x.layers[j].out, y.layers[j].out);
      EXPECT_EQ(x.layers[j].approximate, y.layers[j].approximate);
      EXPECT_EQ(x.layers[j].eps, y.layers[j].eps);
    }
  }
  EXPECT_EQ(a.data.train, b.data.train);
  EXPECT_EQ(a.data.validation, b.data.validation);
  EXPECT_EQ(a.data.features, b.data.features);
  EXPECT_EQ(a.data.labels, b.data.labels);
  EXPECT_EQ(a.data.targets, b.data.targets);
  EXPECT_EQ(a.data.batch_size, b.data.batch_size);
  EXPECT_EQ(a.data.eval_batch_size, b.data.eval_batch_size);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.data.drop_last, b.data.drop_last);
  EXPECT_EQ(a.data.prefetch, b.data.prefetch);
  EXPECT_EQ(a.data.in_memory, b.data.in_memory);
  EXPECT_EQ(a.data.huge_pages, b.data.huge_pages);
  EXPECT_EQ(a.data.log1p, b.data.log1p);
  EXPECT_EQ(a.data.scale, b.data.scale);
  EXPECT_EQ(a.data.shift, b.data.shift);
  EXPECT_EQ(a.data.normalize, b.data.normalize);
  EXPECT_EQ(a.data.mean, b.data.mean);
  EXPECT_EQ(a.data.std, b.data.std);
  EXPECT_EQ(a.data.augment_flip, b.data.augment_flip);
  EXPECT_EQ(a.data.augment_crop_padding, b.data.augment_crop_padding);
  EXPECT_EQ(a.data.augment_rot90, b.data.augment_rot90);
  EXPECT_EQ(a.train.time_limit, b.train.time_limit);
  EXPECT_EQ(a.train.accumulate, b.train.accumulate);
  EXPECT_EQ(a.optimizer.no_decay, b.optimizer.no_decay);
  EXPECT_EQ(a.checkpoint.every_steps, b.checkpoint.every_steps);
  EXPECT_EQ(a.checkpoint.every_seconds, b.checkpoint.every_seconds);
  EXPECT_EQ(a.checkpoint.keep, b.checkpoint.keep);
  EXPECT_EQ(a.checkpoint.at_end, b.checkpoint.at_end);
  EXPECT_EQ(a.checkpoint.on_signal, b.checkpoint.on_signal);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.epochs, b.train.epochs);
  EXPECT_EQ(a.train.log_every, b.train.log_every);
  EXPECT_EQ(a.train.eval_every, b.train.eval_every);
  EXPECT_EQ(a.optimizer.type, b.optimizer.type);
  EXPECT_EQ(a.optimizer.lr, b.optimizer.lr);
  EXPECT_EQ(a.optimizer.weight_decay, b.optimizer.weight_decay);
  EXPECT_EQ(a.optimizer.beta1, b.optimizer.beta1);
  EXPECT_EQ(a.optimizer.beta2, b.optimizer.beta2);
  EXPECT_EQ(a.optimizer.eps, b.optimizer.eps);
  EXPECT_EQ(a.optimizer.momentum, b.optimizer.momentum);
  EXPECT_EQ(a.optimizer.nesterov, b.optimizer.nesterov);
  EXPECT_EQ(a.optimizer.grad_clip, b.optimizer.grad_clip);
  EXPECT_EQ(a.schedule.type, b.schedule.type);
  EXPECT_EQ(a.schedule.warmup_steps, b.schedule.warmup_steps);
  EXPECT_EQ(a.schedule.min_lr, b.schedule.min_lr);
  EXPECT_EQ(a.schedule.step_size, b.schedule.step_size);
  EXPECT_EQ(a.schedule.gamma, b.schedule.gamma);
  EXPECT_EQ(a.precision.mode, b.precision.mode);
  EXPECT_EQ(a.precision.loss_scale, b.precision.loss_scale);
  EXPECT_EQ(a.precision.init_scale, b.precision.init_scale);
  EXPECT_EQ(a.precision.growth_factor, b.precision.growth_factor);
  EXPECT_EQ(a.precision.backoff_factor, b.precision.backoff_factor);
  EXPECT_EQ(a.precision.growth_interval, b.precision.growth_interval);
  EXPECT_EQ(a.precision.max_skipped_steps, b.precision.max_skipped_steps);
}

// Every key set away from its default, strings with characters TOML must escape.
const std::string full_deck = R"([run]
seed = 1234
output = "out/dir \"quoted\" \\ back\tslash é"
device = "auto"
threads = 3

[model]
loss = "mse"

[[model.layers]]
type = "linear"
name = "encoder"
out = 128
in = 32
bias = false

[[model.layers]]
type = "leaky_relu"
negative_slope = 0.2

[[model.layers]]
type = "layernorm"
eps = 1e-6

[[model.layers]]
type = "dropout"
p = 0.25

[[model.layers]]
type = "gelu"
approximate = "tanh"

[[model.layers]]
type = "tanh"

[[model.layers]]
type = "relu"
name = "act-last"

[[model.layers]]
type = "linear"
out = 3

[data]
train = "/data/train.h5"
validation = "/data/val.h5"
features = "/x"
labels = "/y"
targets = "/t"
batch_size = 256
eval_batch_size = 512
shuffle = false
drop_last = true

[train]
epochs = 5
log_every = 7
eval_every = 100

[optimizer]
type = "sgd"
lr = 0.30000000000000004
weight_decay = 5e-4
beta1 = 0.8
beta2 = 0.99
eps = 1e-7
momentum = 0.9
nesterov = true
grad_clip = 1.5

[schedule]
type = "cosine"
warmup_steps = 50
min_lr = 1e-5
step_size = 30
gamma = 0.5

[precision]
mode = "fp16"
loss_scale = "dynamic"
init_scale = 1024
growth_factor = 3.0
backoff_factor = 0.25
growth_interval = 500
max_skipped_steps = 20
)";

// ---------------------------------------------------------------------------------------------------------------------
// Values, defaults, positions, round trip
// ---------------------------------------------------------------------------------------------------------------------

TEST(RunConfig, FullDeckValues) {
  const RunConfig config = parse(full_deck);
  EXPECT_EQ(config.deck_path, deck_path);
  EXPECT_EQ(config.run.seed, 1234u);
  EXPECT_EQ(config.run.output, "out/dir \"quoted\" \\ back\tslash é");
  EXPECT_EQ(config.run.device, Device::automatic);
  EXPECT_EQ(config.run.threads, 3);
  EXPECT_EQ(config.model.loss, LossKind::mse);
  ASSERT_EQ(config.model.layers.size(), 8u);
  EXPECT_EQ(config.model.layers[0].name, "encoder");
  EXPECT_EQ(config.model.layers[0].out, 128);
  EXPECT_EQ(config.model.layers[0].in, 32);
  EXPECT_FALSE(config.model.layers[0].bias);
  EXPECT_EQ(config.model.layers[1].type, LayerType::leaky_relu);
  EXPECT_EQ(config.model.layers[1].name, "leaky_relu1");
  EXPECT_EQ(config.model.layers[1].negative_slope, 0.2);
  EXPECT_EQ(config.model.layers[2].eps, 1e-6);
  EXPECT_EQ(config.model.layers[3].p, 0.25);
  EXPECT_EQ(config.model.layers[4].approximate, GeluApproximation::tanh);
  EXPECT_EQ(config.model.layers[6].name, "act-last");
  EXPECT_EQ(config.model.layers[7].name, "linear7");
  EXPECT_EQ(config.model.layers[7].out, 3);
  EXPECT_TRUE(config.model.layers[7].bias);
  EXPECT_EQ(config.data.train, (std::vector<std::string>{"/data/train.h5"}));
  EXPECT_EQ(config.data.validation, (std::vector<std::string>{"/data/val.h5"}));
  EXPECT_EQ(config.data.features, "/x");
  EXPECT_EQ(config.data.labels, "/y");
  EXPECT_EQ(config.data.targets, "/t");
  EXPECT_EQ(config.data.batch_size, 256);
  EXPECT_EQ(config.data.eval_batch_size, 512);
  EXPECT_EQ(config.data.shuffle, ShuffleMode::none);
  EXPECT_TRUE(config.data.drop_last);
  EXPECT_EQ(config.train.steps, 0);
  EXPECT_EQ(config.train.epochs, 5);
  EXPECT_EQ(config.train.log_every, 7);
  EXPECT_EQ(config.train.eval_every, 100);
  EXPECT_EQ(config.optimizer.type, OptimizerKind::sgd);
  EXPECT_EQ(config.optimizer.lr, 0.1 + 0.2);
  EXPECT_EQ(config.optimizer.weight_decay, 5e-4);
  EXPECT_EQ(config.optimizer.beta1, 0.8);
  EXPECT_EQ(config.optimizer.beta2, 0.99);
  EXPECT_EQ(config.optimizer.eps, 1e-7);
  EXPECT_EQ(config.optimizer.momentum, 0.9);
  EXPECT_TRUE(config.optimizer.nesterov);
  EXPECT_EQ(config.optimizer.grad_clip, 1.5);
  EXPECT_EQ(config.schedule.type, ScheduleKind::cosine);
  EXPECT_EQ(config.schedule.warmup_steps, 50);
  EXPECT_EQ(config.schedule.min_lr, 1e-5);
  EXPECT_EQ(config.schedule.step_size, 30);
  EXPECT_EQ(config.schedule.gamma, 0.5);
  EXPECT_EQ(config.precision.mode, PrecisionMode::fp16);
  EXPECT_EQ(config.precision.loss_scale, LossScaleSetting{DynamicLossScale{}});
  EXPECT_EQ(config.precision.init_scale, 1024.0);  // an integer where a float is expected
  EXPECT_EQ(config.precision.growth_factor, 3.0);
  EXPECT_EQ(config.precision.backoff_factor, 0.25);
  EXPECT_EQ(config.precision.growth_interval, 500);
  EXPECT_EQ(config.precision.max_skipped_steps, 20);
}

TEST(RunConfig, Defaults) {
  const RunConfig config = parse(minimal_body);
  const RunConfig defaults;
  EXPECT_EQ(config.run.seed, defaults.run.seed);
  EXPECT_EQ(config.run.output, "runs/test");  // runs/<deck file stem>
  EXPECT_EQ(config.run.device, Device::cpu);
  EXPECT_EQ(config.run.threads, 0);
  EXPECT_EQ(config.model.loss, LossKind::cross_entropy);
  ASSERT_EQ(config.model.layers.size(), 1u);
  EXPECT_EQ(config.model.layers[0].name, "linear0");
  EXPECT_EQ(config.model.layers[0].in, 0);
  EXPECT_TRUE(config.model.layers[0].bias);
  // "train.h5" does not exist from the current directory, so it is taken relative to the deck's directory.
  EXPECT_EQ(config.data.train, (std::vector<std::string>{fs::absolute("decks/train.h5").lexically_normal().string()}));
  EXPECT_TRUE(config.data.validation.empty());
  EXPECT_EQ(config.data.features, "/features");
  EXPECT_EQ(config.data.labels, "/labels");
  EXPECT_EQ(config.data.targets, "/targets");
  EXPECT_EQ(config.data.batch_size, 64);
  EXPECT_EQ(config.data.eval_batch_size, 0);
  EXPECT_EQ(config.data.shuffle, ShuffleMode::global);
  EXPECT_FALSE(config.data.drop_last);
  EXPECT_EQ(config.train.steps, 100);
  EXPECT_EQ(config.train.epochs, 0);
  EXPECT_EQ(config.train.log_every, 10);
  EXPECT_EQ(config.train.eval_every, 0);
  EXPECT_EQ(config.optimizer.type, OptimizerKind::adamw);
  EXPECT_EQ(config.optimizer.lr, 1e-3);
  EXPECT_EQ(config.optimizer.weight_decay, 0.0);
  EXPECT_EQ(config.optimizer.beta1, 0.9);
  EXPECT_EQ(config.optimizer.beta2, 0.999);
  EXPECT_EQ(config.optimizer.eps, 1e-8);
  EXPECT_EQ(config.optimizer.momentum, 0.0);
  EXPECT_FALSE(config.optimizer.nesterov);
  EXPECT_EQ(config.optimizer.grad_clip, 0.0);
  EXPECT_EQ(config.schedule.type, ScheduleKind::constant);
  EXPECT_EQ(config.schedule.warmup_steps, 0);
  EXPECT_EQ(config.schedule.min_lr, 0.0);
  EXPECT_EQ(config.schedule.step_size, 1000);
  EXPECT_EQ(config.schedule.gamma, 0.1);
  EXPECT_EQ(config.precision.mode, PrecisionMode::fp32);
  EXPECT_EQ(config.precision.loss_scale, LossScaleSetting{AutoLossScale{}});
  EXPECT_EQ(config.precision.init_scale, 65536.0);
  EXPECT_EQ(config.precision.growth_factor, 2.0);
  EXPECT_EQ(config.precision.backoff_factor, 0.5);
  EXPECT_EQ(config.precision.growth_interval, 2000);
  EXPECT_EQ(config.precision.max_skipped_steps, 100);
}

TEST(RunConfig, ResolvedDeckRoundTrip) {
  for (const std::string& deck : {full_deck, minimal_body}) {
    const RunConfig first = parse(deck);
    const std::string resolved = to_toml(first);
    SCOPED_TRACE(resolved);
    const RunConfig second = parse(resolved);
    expect_same_values(first, second);
    EXPECT_EQ(to_toml(second), resolved);
  }
}

TEST(RunConfig, ResidualBlockRoundTrip) {
  const std::string deck =
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[model]\nlayers = [\n  {type = \"linear\", out = 8},\n"
      "  {type = \"residual\", name = \"mlp\", layers = [{type = \"layernorm\", eps = 1e-6}, {type = \"linear\", out = "
      "32},\n    {type = \"gelu\", approximate = \"tanh\"}, {type = \"linear\", out = 8, name = \"projection\"}]},\n"
      "  {type = \"residual\", layers = [{type = \"relu\"}]},\n]\n";
  const RunConfig first = parse(deck);
  ASSERT_EQ(first.model.layers.size(), 3u);
  const LayerSpec& block = first.model.layers[1];
  EXPECT_EQ(block.type, LayerType::residual);
  EXPECT_EQ(block.name, "mlp");
  ASSERT_EQ(block.layers.size(), 4u);
  EXPECT_EQ(block.layers[0].name, "layernorm0");
  EXPECT_EQ(block.layers[0].eps, 1e-6);
  EXPECT_EQ(block.layers[1].out, 32);
  EXPECT_EQ(block.layers[2].approximate, GeluApproximation::tanh);
  EXPECT_EQ(block.layers[3].name, "projection");
  EXPECT_EQ(first.model.layers[2].name, "residual2");
  const std::string resolved = to_toml(first);
  SCOPED_TRACE(resolved);
  EXPECT_CONTAINS(
      resolved,
      "type = \"residual\"\nname = \"mlp\"\nlayers = [\n  { type = \"layernorm\", name = \"layernorm0\", eps = "
      "1e-06 },\n");
  const RunConfig second = parse(resolved);
  expect_same_values(first, second);
  EXPECT_EQ(to_toml(second), resolved);
}

TEST(RunConfig, TransformerBlock) {
  const std::string deck =
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[model]\nlayers = [\n  {type = \"embedding\", vocabulary = 256, "
      "out = 16},\n  {type = \"transformer_block\", heads = 4},\n  {type = \"transformer_block\", heads = 2, causal = "
      "false, mlp_ratio = 2, name = \"h1\"},\n]\n";
  const RunConfig config = parse(deck);
  const LayerSpec& first = config.model.layers[1];
  EXPECT_EQ(first.name, "transformer_block1");
  EXPECT_EQ(first.heads, 4);
  EXPECT_TRUE(first.causal);
  EXPECT_EQ(first.mlp_ratio, 4);
  const RunConfig second = parse(to_toml(config));
  EXPECT_EQ(second.model.layers[2].mlp_ratio, 2);
  EXPECT_FALSE(second.model.layers[2].causal);
  EXPECT_EQ(to_toml(second), to_toml(config));
  const std::vector<LayerSpec> blocks = expand_transformer_block(config.model.layers[2], 16);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].type, LayerType::residual);
  EXPECT_EQ(blocks[0].name, "h1");
  ASSERT_EQ(blocks[0].layers.size(), 2u);
  EXPECT_EQ(blocks[0].layers[1].type, LayerType::attention);
  EXPECT_EQ(blocks[0].layers[1].heads, 2);
  EXPECT_FALSE(blocks[0].layers[1].causal);
  ASSERT_EQ(blocks[1].layers.size(), 4u);
  EXPECT_EQ(blocks[1].layers[1].out, 32);
  EXPECT_EQ(blocks[1].layers[2].approximate, GeluApproximation::tanh);
  EXPECT_EQ(blocks[1].layers[3].name, "c_proj");
  EXPECT_EQ(blocks[1].layers[3].out, 16);
  EXPECT_EQ(blocks[0].layers[1].dropout, 0.0);
  // dropout goes to the attention's probabilities; residual_dropout ends each branch with a dropout layer (none when 0)
  const RunConfig dropping = parse(
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[model]\nlayers = [\n  {type = \"embedding\", vocabulary = 256, "
      "out = 16},\n  {type = \"transformer_block\", heads = 4, dropout = 0.1, residual_dropout = 0.2, name = "
      "\"h0\"},\n]\n");
  EXPECT_EQ(to_toml(parse(to_toml(dropping))), to_toml(dropping));
  const std::vector<LayerSpec> dropped = expand_transformer_block(dropping.model.layers[1], 16);
  EXPECT_EQ(dropped[0].layers[1].dropout, 0.1);
  for (std::size_t branch = 0; branch < 2; ++branch) {
    const LayerSpec& last = dropped[branch].layers.back();
    EXPECT_EQ(last.type, LayerType::dropout);
    EXPECT_EQ(last.p, 0.2);
    EXPECT_EQ(last.name, branch == 0 ? "resid_dropout_1" : "resid_dropout_2");
  }
  EXPECT_CONTAINS(error_of("[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[[model.layers]]\ntype = "
                           "\"transformer_block\"\nheads = 1\nresidual_dropout = 1.5\n")
                      .message,
                  "model.layers[0].residual_dropout");
  EXPECT_CONTAINS(
      error_of("[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[[model.layers]]\ntype = \"transformer_block\"\n")
          .message,
      "model.layers[0] (transformer_block) needs heads");
  EXPECT_CONTAINS(
      error_of("[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[[model.layers]]\ntype = \"residual\"\nlayers = "
               "[{type = \"transformer_block\", heads = 1}]\n")
          .message,
      "is a transformer_block (two residual blocks) inside the residual block model.layers[0]: nested "
      "residual blocks are not supported yet");
}

TEST(RunConfig, ResolvedDeckHasEveryKey) {
  const std::string resolved = to_toml(parse(minimal_body));
  std::string section;
  std::set<std::string> written;
  std::istringstream lines(resolved);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[[", 0) == 0) {
      section = "model.layers[]";
    } else if (line.rfind("[", 0) == 0) {
      section = line.substr(1, line.size() - 2);
    } else if (const auto equals = line.find(" = "); equals != std::string::npos && line[0] != '#') {
      written.insert(section + "." + line.substr(0, equals));
    }
  }
  for (const auto& key : accepted_keys()) {
    if (key == "model.layers" || key.rfind("model.layers[].", 0) == 0) continue;  // layer keys depend on the type
    EXPECT_TRUE(written.count(key)) << key << " missing from\n" << resolved;
  }
  for (const std::string key :
       {"model.layers[].type", "model.layers[].name", "model.layers[].out", "model.layers[].in", "model.layers[].bias"})
    EXPECT_TRUE(written.count(key)) << key;
}

TEST(RunConfig, RoundTripKeepsNumbersExactly) {
  for (const std::string value : {"0.1", "1e-300", "1.7976931348623157e308", "123456789.125", "3", "2.5e-08"}) {
    const RunConfig first = parse(deck_with("optimizer.lr", value));
    const RunConfig second = parse(to_toml(first));
    EXPECT_EQ(first.optimizer.lr, second.optimizer.lr) << value;
  }
  // data.mean/data.std: arrays of numbers, recorded in config.toml, so they must survive the round trip bit for bit.
  const RunConfig standardised =
      parse(deck_with("data.mean", "[100.0822396343696, -5, 0.1, 1e-300]\nstd = [3, 0.5, 2.5e-08, 1]"));
  EXPECT_EQ(standardised.data.mean, (std::vector<double>{100.0822396343696, -5, 0.1, 1e-300}));
  EXPECT_EQ(parse(to_toml(standardised)).data.mean, standardised.data.mean);
  EXPECT_EQ(parse(to_toml(standardised)).data.std, standardised.data.std);
  const RunConfig big_seed = parse(deck_with("run.seed", "9223372036854775807"));
  EXPECT_EQ(parse(to_toml(big_seed)).run.seed, 9223372036854775807ull);
}

TEST(RunConfig, InlineLayerArrayEqualsLayerTables) {
  const std::string tables =
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n"
      "[[model.layers]]\ntype = \"linear\"\nout = 64\n"
      "[[model.layers]]\ntype = \"dropout\"\np = 0.1\n";
  const std::string inline_array =
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n"
      "[model]\nlayers = [ {type = \"linear\", out = 64}, { type = \"dropout\", p = 0.1 } ]\n";
  const RunConfig a = parse(tables), b = parse(inline_array);
  expect_same_values(a, b);
  EXPECT_EQ(b.positions.at("model.layers[1].p").line, 6);
  EXPECT_EQ(b.model.layers[1].position.line, 6);
  EXPECT_EQ(b.model.layers[1].position.column, 41);  // the '{' of the second inline table
}

TEST(RunConfig, PositionsOfEveryKeyRead) {
  const RunConfig config = parse(full_deck);
  EXPECT_EQ(config.positions.at("run.seed").line, 2);
  EXPECT_EQ(config.positions.at("run.seed").column, 1);
  EXPECT_EQ(config.positions.at("model.layers[0]").line, 10);
  EXPECT_EQ(config.model.layers[0].position.line, 10);
  EXPECT_EQ(config.positions.at("model.layers[3].p").line, 27);
  EXPECT_EQ(config.positions.at("model.layers[4].approximate").line, 31);
  EXPECT_EQ(config.positions.at("optimizer.lr").line, 62);
  EXPECT_EQ(config.where("optimizer.lr"), "decks/test.toml:62:1");
  EXPECT_EQ(config.where("run.threads"), "decks/test.toml:5:1");
  // Keys from defaults have no position.
  EXPECT_EQ(parse(minimal_body).where("optimizer.lr"), "decks/test.toml");
  EXPECT_EQ(parse(minimal_body).positions.count("optimizer.lr"), 0u);
  // Every key of the full deck was recorded.
  for (const auto& key : {"run.output", "model.loss", "data.drop_last", "train.eval_every", "optimizer.grad_clip",
                          "schedule.gamma", "precision.max_skipped_steps", "model.layers[7].out"})
    EXPECT_TRUE(config.positions.count(key)) << key;
}

TEST(RunConfig, LossScaleWordsAndNumbers) {
  const auto scale_of = [](const std::string& value) {
    return parse(deck_with("precision.loss_scale", value)).precision.loss_scale;
  };
  EXPECT_EQ(scale_of("\"auto\""), LossScaleSetting{AutoLossScale{}});
  EXPECT_EQ(scale_of("\"dynamic\""), LossScaleSetting{DynamicLossScale{}});
  EXPECT_EQ(scale_of("\"none\""), LossScaleSetting{NoLossScale{}});
  EXPECT_EQ(scale_of("1024"), LossScaleSetting{FixedLossScale{1024}});
  EXPECT_EQ(scale_of("1024.0"), LossScaleSetting{FixedLossScale{1024}});
  EXPECT_EQ(scale_of("\"1e3\""), LossScaleSetting{FixedLossScale{1000}});
  EXPECT_EQ(scale_of("0.5"), LossScaleSetting{FixedLossScale{0.5}});
  const RunConfig fixed = parse(deck_with("precision.loss_scale", "128.5"));
  EXPECT_CONTAINS(to_toml(fixed), "loss_scale = \"128.5\"\n");  // one spelling per value
  EXPECT_EQ(parse(to_toml(fixed)).precision.loss_scale, LossScaleSetting{FixedLossScale{128.5}});
  EXPECT_CONTAINS(to_toml(parse(deck_with("precision.loss_scale", "\"1e3\""))), "loss_scale = \"1000\"\n");
}

// ---------------------------------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------------------------------

TEST(RunConfig, ConvolutionAndPoolingKeys) {
  const RunConfig config = parse(
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[model]\nlayers = [\n"
      "  { type = \"conv2d\", out = 8, kernel = [3, 5], padding = 1, dilation = [1, 2], groups = 2, bias = false },\n"
      "  { type = \"maxpool2d\", kernel = 2 },\n  { type = \"avgpool3d\", kernel = 2, stride = [1, 2, 2] },\n"
      "  { type = \"groupnorm\", groups = 4, eps = 1e-3 },\n  { type = \"global_avgpool\" },\n  { type = \"flatten\" "
      "},\n]\n");
  const auto& layers = config.model.layers;
  ASSERT_EQ(layers.size(), 6u);
  EXPECT_EQ(layers[0].kernel, (std::vector<std::int64_t>{3, 5}));
  EXPECT_EQ(layers[0].stride, (std::vector<std::int64_t>{1}));  // conv default
  EXPECT_EQ(layers[0].padding, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(layers[0].dilation, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(layers[0].groups, 2);
  EXPECT_FALSE(layers[0].bias);
  EXPECT_EQ(layers[1].stride, (std::vector<std::int64_t>{2}));  // pooling default: the kernel
  EXPECT_EQ(layers[2].stride, (std::vector<std::int64_t>{1, 2, 2}));
  EXPECT_EQ(layers[3].groups, 4);
  EXPECT_EQ(layers[4].name, "global_avgpool4");
  // The resolved deck writes the extents back (one value as an integer) and reads back the same.
  const std::string resolved = to_toml(config);
  EXPECT_CONTAINS(resolved, "kernel = [3, 5]\nstride = 1\npadding = 1\ndilation = [1, 2]\ngroups = 2");
  const RunConfig again = parse_run_config(resolved, "decks/resolved.toml");
  EXPECT_EQ(again.model.layers[2].stride, layers[2].stride);
  EXPECT_EQ(again.model.layers[0].dilation, layers[0].dilation);
  // --set changes an extent.
  const RunConfig changed = parse_run_config(to_toml(config), "decks/resolved.toml", {"model.layers[1].kernel=[3, 1]"});
  EXPECT_EQ(changed.model.layers[1].kernel, (std::vector<std::int64_t>{3, 1}));
}

TEST(RunConfig, AttentionKeys) {
  const RunConfig config = parse(
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[model]\nlayers = [\n"
      "  { type = \"embedding\", vocabulary = 256, out = 16, positions = true },\n"
      "  { type = \"attention\", heads = 4 },\n  { type = \"attention\", heads = 2, causal = false },\n]\n");
  const auto& layers = config.model.layers;
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[1].type, LayerType::attention);
  EXPECT_EQ(layers[1].name, "attention1");
  EXPECT_EQ(layers[1].heads, 4);
  EXPECT_TRUE(layers[1].causal);  // the default: a decoder
  EXPECT_EQ(layers[1].dropout, 0.0);
  EXPECT_FALSE(layers[2].causal);
  const std::string resolved = to_toml(config);
  EXPECT_CONTAINS(resolved, "type = \"attention\"\nname = \"attention2\"\nheads = 2\ncausal = false\ndropout = 0.0\n");
  expect_same_values(config, parse_run_config(resolved, "decks/resolved.toml"));
  const RunConfig changed = parse_run_config(resolved, "decks/resolved.toml", {"model.layers[1].heads=8"});
  EXPECT_EQ(changed.model.layers[1].heads, 8);
}

TEST(RunConfig, ToSequenceKeys) {
  const RunConfig config = parse(
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[model]\nlayers = [\n"
      "  { type = \"conv2d\", out = 8, kernel = 4, stride = 4 },\n"
      "  { type = \"to_sequence\", positions = true, class_token = true },\n  { type = \"to_sequence\" },\n]\n");
  const auto& layers = config.model.layers;
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[1].type, LayerType::to_sequence);
  EXPECT_TRUE(layers[1].positions);
  EXPECT_TRUE(layers[1].class_token);
  EXPECT_FALSE(layers[2].positions);  // the defaults: neither
  EXPECT_FALSE(layers[2].class_token);
  const std::string resolved = to_toml(config);
  EXPECT_CONTAINS(resolved, "type = \"to_sequence\"\nname = \"to_sequence1\"\npositions = true\nclass_token = true\n");
  expect_same_values(config, parse_run_config(resolved, "decks/resolved.toml"));
  const RunConfig changed = parse_run_config(resolved, "decks/resolved.toml", {"model.layers[2].class_token=true"});
  EXPECT_TRUE(changed.model.layers[2].class_token);
}

// ---------------------------------------------------------------------------------------------------------------------
// --set overrides
// ---------------------------------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------------------------------
// Files: load_run_config and data path resolution
// ---------------------------------------------------------------------------------------------------------------------

// A scratch directory that is also the current directory for the test's duration.
class ScratchDirectory {
 public:
  ScratchDirectory()
      : root_(fs::temp_directory_path() / ("hpctrain_run_config_test_" + std::to_string(::getpid()))),
        previous_(fs::current_path()) {
    fs::remove_all(root_);
    fs::create_directories(root_ / "cwd");
    fs::current_path(root_ / "cwd");
  }
  ~ScratchDirectory() {
    fs::current_path(previous_);
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  [[nodiscard]] const fs::path& root() const { return root_; }

 private:
  fs::path root_;
  fs::path previous_;
};

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(RunConfigFiles, DataFileListsAndGlobPatterns) {
  const ScratchDirectory scratch;
  const fs::path root = fs::canonical(scratch.root());
  write_file(root / "cwd" / "part_0.h5", "");
  write_file(root / "decks" / "shards" / "s_0.h5", "");
  write_file(root / "decks" / "exp.toml",
             "[data]\ntrain = [\"part_*.h5\", \"shards/s_*.h5\", \"\"]\nvalidation = \"\"\n"
             "[train]\nsteps = 3\n[[model.layers]]\ntype = \"relu\"\n");
  const RunConfig config = load_run_config("../decks/exp.toml");
  // A pattern matching from the current directory stays there; one that does not is taken from the deck's directory.
  // Patterns are kept (expanded when the data is opened); empty entries mean no file.
  EXPECT_EQ(config.data.train, (std::vector<std::string>{(root / "cwd" / "part_*.h5").string(),
                                                         (root / "decks" / "shards" / "s_*.h5").string()}));
  EXPECT_TRUE(config.data.validation.empty());
  EXPECT_NE(to_toml(config).find("validation = []\n"), std::string::npos);
  expect_same_values(config, parse_run_config(to_toml(config), "resolved.toml"));
  const RunConfig listed = load_run_config("../decks/exp.toml", {"data.train=[\"a.h5\", \"b.h5\"]"});
  EXPECT_EQ(listed.data.train,
            (std::vector<std::string>{(root / "decks" / "a.h5").string(), (root / "decks" / "b.h5").string()}));
  const RunConfig bare = load_run_config("../decks/exp.toml", {"data.train=shards/s_*.h5"});
  EXPECT_EQ(bare.data.train, (std::vector<std::string>{(root / "decks" / "shards" / "s_*.h5").string()}));
  try {
    load_run_config("../decks/exp.toml", {"data.train=[]"});
    FAIL() << "no error";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("data.train is missing"), std::string::npos) << error.what();
  }
}

TEST(RunConfigFiles, LoadAndResolveDataPaths) {
  const ScratchDirectory scratch;
  const fs::path root = fs::canonical(scratch.root());
  write_file(root / "cwd" / "local.h5", "");
  write_file(root / "decks" / "data" / "train.h5", "");
  write_file(root / "decks" / "exp.toml",
             "[data]\ntrain = \"data/train.h5\"\nvalidation = \"local.h5\"\n"
             "[train]\nsteps = 3\n[[model.layers]]\ntype = \"relu\"\n");
  const RunConfig config = load_run_config("../decks/exp.toml", {"train.steps=4"});
  EXPECT_EQ(config.deck_path, "../decks/exp.toml");
  // Not found from the current directory: relative to the deck's directory.
  EXPECT_EQ(config.data.train, (std::vector<std::string>{(root / "decks" / "data" / "train.h5").string()}));
  // Found from the current directory: that file.
  EXPECT_EQ(config.data.validation, (std::vector<std::string>{(root / "cwd" / "local.h5").string()}));
  EXPECT_EQ(config.run.output, "runs/exp");
  EXPECT_EQ(config.train.steps, 4);
  EXPECT_EQ(config.where("data.train"), "../decks/exp.toml:2:1");

  // The resolved deck, written elsewhere and read from there, names the same files.
  write_file(root / "elsewhere" / "config.toml", to_toml(config));
  const RunConfig again = load_run_config((root / "elsewhere" / "config.toml").string());
  expect_same_values(config, again);

  // Errors in a loaded deck name the path as given.
  write_file(root / "decks" / "bad.toml", "[optimizer]\nlearning_rate = 1\n");
  try {
    load_run_config("../decks/bad.toml");
    FAIL() << "no error";
  } catch (const InputError& error) {
    EXPECT_CONTAINS(error.what(),
                    "../decks/bad.toml:2:1: unknown key 'optimizer.learning_rate'; did you mean "
                    "'optimizer.lr'?");
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Documentation
// ---------------------------------------------------------------------------------------------------------------------

// docs/input-reference.md, found from this source file's path, or (when the compiler was given a relative path, as
// with some ccache set-ups) by walking up from the current directory, which is normally inside the source tree.
fs::path find_input_reference() {
  const fs::path relative = fs::path("docs") / "input-reference.md";
  const fs::path from_source = fs::path(__FILE__).parent_path() / ".." / ".." / relative;
  if (fs::path(__FILE__).is_absolute() && fs::exists(from_source)) return from_source;
  for (fs::path directory = fs::current_path(); !directory.empty(); directory = directory.parent_path()) {
    if (fs::exists(directory / relative)) return directory / relative;
    if (directory == directory.root_path()) break;
  }
  return from_source;
}

// ---------------------------------------------------------------------------------------------------------------------
// Data pipeline, checkpoint, time limit, accumulation and no_decay keys
// ---------------------------------------------------------------------------------------------------------------------

TEST(RunConfig, DataPipelineAndCheckpointKeys) {
  const RunConfig defaults = parse(minimal_body);
  EXPECT_EQ(defaults.data.prefetch, 2);
  EXPECT_FALSE(defaults.data.in_memory);
  EXPECT_FALSE(defaults.data.huge_pages);
  EXPECT_EQ(defaults.data.scale, 1.0);
  EXPECT_FALSE(defaults.data.augment_flip);
  EXPECT_EQ(defaults.data.augment_crop_padding, 0);
  EXPECT_FALSE(defaults.data.augment_rot90);
  EXPECT_EQ(defaults.checkpoint.on_signal,
            (std::vector<CheckpointSignal>{CheckpointSignal::usr1, CheckpointSignal::usr2, CheckpointSignal::term}));
  EXPECT_EQ(defaults.optimizer.no_decay, (std::vector<std::string>{"bias", "norm"}));

  const RunConfig config =
      parse(minimal_body,
            {"data.shuffle=local", "data.prefetch=0", "data.in_memory=true", "data.huge_pages=true", "data.log1p=true",
             "data.scale=0.5", "data.shift=-1", "data.augment_flip=true", "data.augment_crop_padding=4",
             "data.augment_rot90=true", "train.time_limit=1:30:00", "train.accumulate=4",
             "optimizer.no_decay=[\"bias\"]", "checkpoint.every_steps=100", "checkpoint.every_seconds=600",
             "checkpoint.keep=0", "checkpoint.at_end=false", "checkpoint.on_signal=[]"});
  EXPECT_EQ(config.data.shuffle, ShuffleMode::local);
  EXPECT_EQ(config.data.prefetch, 0);
  EXPECT_TRUE(config.data.in_memory);
  EXPECT_TRUE(config.data.huge_pages);
  EXPECT_TRUE(config.data.log1p);
  EXPECT_EQ(config.data.scale, 0.5);
  EXPECT_EQ(config.data.shift, -1.0);
  EXPECT_TRUE(config.data.augment_flip);
  EXPECT_EQ(config.data.augment_crop_padding, 4);
  EXPECT_TRUE(config.data.augment_rot90);
  EXPECT_EQ(config.train.time_limit.text, "1:30:00");
  EXPECT_EQ(config.train.time_limit.seconds, 5400.0);
  EXPECT_EQ(config.train.accumulate, 4);
  EXPECT_EQ(config.optimizer.no_decay, (std::vector<std::string>{"bias"}));
  EXPECT_EQ(config.checkpoint.every_steps, 100);
  EXPECT_EQ(config.checkpoint.every_seconds, 600.0);
  EXPECT_EQ(config.checkpoint.keep, 0);
  EXPECT_FALSE(config.checkpoint.at_end);
  EXPECT_TRUE(config.checkpoint.on_signal.empty());
  // The resolved deck writes them back (shuffle words global/none as booleans) and reads back the same.
  const std::string resolved = to_toml(config);
  EXPECT_CONTAINS(resolved, "shuffle = \"local\"\n");
  EXPECT_CONTAINS(resolved, "on_signal = []\n");
  EXPECT_CONTAINS(resolved, "no_decay = [\"bias\"]\n");
  EXPECT_CONTAINS(resolved, "augment_flip = true\naugment_crop_padding = 4\naugment_rot90 = true\n");
  expect_same_values(config, parse(resolved));
  EXPECT_CONTAINS(to_toml(defaults), "shuffle = true\n");
  EXPECT_EQ(parse(to_toml(defaults)).data.shuffle, ShuffleMode::global);
  // A single string is a one-element list.
  EXPECT_EQ(parse(deck_with("optimizer.no_decay", "\"norm\"")).optimizer.no_decay, (std::vector<std::string>{"norm"}));
}

TEST(RunConfigDocs, ReferenceListsExactlyTheAcceptedKeys) {
  const fs::path doc_path = find_input_reference();
  std::ifstream file(doc_path);
  ASSERT_TRUE(file) << "cannot open " << doc_path;
  std::stringstream buffer;
  buffer << file.rdbuf();
  const std::string doc = buffer.str();

  const auto keys = accepted_keys();
  const std::set<std::string> accepted(keys.begin(), keys.end());
  EXPECT_EQ(accepted.size(), keys.size()) << "accepted_keys() has duplicates";
  for (const auto& key : keys) EXPECT_TRUE(contains(doc, "`" + key + "`")) << key << " is not in " << doc_path;

  // Every backticked dotted key in the document must be one the parser accepts.
  const std::regex documented_key(
      R"(`((run|model|data|train|optimizer|schedule|precision|checkpoint)\.[A-Za-z0-9_.\[\]]+)`)");
  std::size_t documented = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), documented_key); it != std::sregex_iterator(); ++it) {
    ++documented;
    EXPECT_TRUE(accepted.count((*it)[1].str())) << (*it)[1].str() << " is documented but the parser does not accept it";
  }
  EXPECT_GE(documented, keys.size());
}

TEST(RunConfigDocs, AcceptedKeysCoverTheSchema) {
  const auto keys = accepted_keys();
  const std::set<std::string> accepted(keys.begin(), keys.end());
  for (const std::string key :
       {"run.seed", "model.layers", "model.layers[].type", "model.layers[].negative_slope", "data.eval_batch_size",
        "optimizer.nesterov", "schedule.step_size", "precision.max_skipped_steps", "precision.tf32"})
    EXPECT_TRUE(accepted.count(key)) << key;
  // per section (run: 5 keys; model: 5 keys and 25 layer keys; data: 19; ...); update when adding a key
  EXPECT_EQ(keys.size(), 5u + 5u + 25u + 19u + 10u + 5u + 8u + 7u + 8u + 5u);
  EXPECT_EQ(parse(deck_with("model.init", "\"gpt2\"")).model.init, InitScheme::gpt2);
  EXPECT_EQ(parse(minimal_body).model.init, InitScheme::pytorch);
}

}  // namespace
}  // namespace hpctrain
