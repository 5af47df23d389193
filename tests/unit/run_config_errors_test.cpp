// The deck parser's errors (every kind of bad deck gets one InputError naming the file, line and key, with a hint) and
// --set overrides.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "run_config_test_support.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;
using namespace deck_test;

TEST(RunConfigErrors, MissingDeckFile) {
  const std::string path = (fs::temp_directory_path() / "hpctrain_no_such_deck.toml").string();
  try {
    load_run_config(path);
    FAIL() << "no error for a missing deck";
  } catch (const InputError& error) {
    EXPECT_CONTAINS(error.what(), path + ": the input deck does not exist");
    EXPECT_FALSE(error.hint().empty());
  }
  try {
    load_run_config(fs::temp_directory_path().string());
    FAIL() << "no error for a directory";
  } catch (const InputError& error) {
    EXPECT_CONTAINS(error.what(), "is a directory");
  }
}

TEST(RunConfigErrors, TomlSyntaxError) {
  const auto error = error_of("[run]\nseed = 1\ndevice = cpu\n" + minimal_body);
  EXPECT_TRUE(std::regex_search(error.message, std::regex(R"(^decks/test\.toml:3:\d+: TOML syntax error: .+)")))
      << error.message;
  const auto duplicate = error_of("[run]\nseed = 1\nseed = 2\n" + minimal_body);
  EXPECT_CONTAINS(duplicate.message, "decks/test.toml:3:");
  EXPECT_CONTAINS(duplicate.message, "seed");
}

TEST(RunConfigErrors, UnknownKeySuggestsClosest) {
  struct Case {
    std::string key, suggestion;
  };
  const std::vector<Case> cases = {
      {"optimizer.learning_rate", "optimizer.lr"},  {"optimizer.wd", "optimizer.weight_decay"},
      {"optimizer.momentun", "optimizer.momentum"}, {"run.sede", "run.seed"},
      {"precision.mdoe", "precision.mode"},         {"schedule.warmup", "schedule.warmup_steps"},
      {"data.batchsize", "data.batch_size"},        {"train.lr", "optimizer.lr"},  // the right key in the wrong section
      {"run.batch_size", "data.batch_size"},
  };
  for (const auto& c : cases) {
    const auto error = error_of(deck_with(c.key, "1"));
    EXPECT_CONTAINS(error.message,
                    "decks/test.toml:2:1: unknown key '" + c.key + "'; did you mean '" + c.suggestion + "'?");
    EXPECT_CONTAINS(error.hint, "valid keys in [");
  }
  // Nothing close: no suggestion, but the hint lists the section's keys.
  const auto far = error_of(
      "[data]\nzzzzzzzzzz = 1\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[[model.layers]]\ntype = "
      "\"relu\"\n");
  EXPECT_CONTAINS(far.message, "decks/test.toml:2:1: unknown key 'data.zzzzzzzzzz'");
  EXPECT_FALSE(contains(far.message, "did you mean"));
  EXPECT_CONTAINS(far.hint, "batch_size");
}

TEST(RunConfigErrors, UnknownSectionAndKeysOutsideSections) {
  const auto section = error_of("[optimiser]\nlr = 0.1\n" + minimal_body);
  EXPECT_CONTAINS(section.message, "decks/test.toml:1:2: unknown section '[optimiser]'; did you mean '[optimizer]'?");
  const auto layers = error_of("[[layers]]\ntype = \"relu\"\n" + minimal_body);
  EXPECT_CONTAINS(layers.message,
                  "decks/test.toml:1:3: unknown section '[[layers]]'; did you mean '[[model.layers]]'?");
  const auto top_level = error_of("seed = 3\n" + minimal_body);
  EXPECT_CONTAINS(top_level.message,
                  "decks/test.toml:1:1: key 'seed' is not inside any section; did you mean "
                  "'run.seed'?");
  const auto not_a_table = error_of("run = 3\n" + minimal_body);
  EXPECT_CONTAINS(not_a_table.message, "decks/test.toml:1:1: 'run' must be a section, got an integer");
}

TEST(RunConfigErrors, WrongTypes) {
  struct Case {
    std::string key, value, expected, got;
  };
  const std::vector<Case> cases = {
      {"data.batch_size", "\"64\"", "must be an integer", "got a string (\"64\")"},
      {"data.batch_size", "64.0", "must be an integer", "got a float (64.0)"},
      {"optimizer.lr", "\"0.1\"", "must be a number", "got a string"},
      {"optimizer.lr", "true", "must be a number", "got a boolean (true)"},
      {"data.shuffle", "1", "must be a boolean or a string (true, false or \"local\")", "got an integer (1)"},
      {"optimizer.no_decay", "1", "must be an array of strings", "got an integer (1)"},
      {"checkpoint.keep", "\"3\"", "must be an integer", "got a string"},
      {"run.device", "1", "must be a string", "got an integer (1)"},
      {"run.seed", "[1, 2]", "must be an integer", "got an array"},
      {"data.features", "{ a = 1 }", "must be a string", "got a table"},
      {"precision.loss_scale", "true", "must be a string (auto, dynamic, none) or a positive number", "got a boolean"},
      {"run.seed", "1979-05-27", "must be an integer", "got a date"},
  };
  for (const auto& c : cases) {
    const auto error = error_of(deck_with(c.key, c.value));
    EXPECT_CONTAINS(error.message, "decks/test.toml:2:1: " + c.key + " " + c.expected + ", got");
    EXPECT_CONTAINS(error.message, c.got);
    EXPECT_CONTAINS(error.hint, "write it like");
  }
  // Integers are accepted where floats are expected.
  EXPECT_EQ(parse(deck_with("optimizer.lr", "2")).optimizer.lr, 2.0);
  // Non-finite floats are refused.
  EXPECT_CONTAINS(error_of(deck_with("optimizer.grad_clip", "inf")).message,
                  "optimizer.grad_clip must be a finite "
                  "number");
  EXPECT_CONTAINS(error_of(deck_with("optimizer.lr", "nan")).message, "optimizer.lr must be a finite number");
}

TEST(RunConfigErrors, OutOfRange) {
  struct Case {
    std::string key, value, rule;
  };
  const std::vector<Case> cases = {
      {"run.seed", "-1", ">= 0"},
      {"run.threads", "-1", ">= 0"},
      {"data.batch_size", "0", ">= 1"},
      {"data.eval_batch_size", "-1", ">= 0"},
      {"train.steps", "-5", ">= 0"},
      {"train.epochs", "-1", ">= 0"},
      {"train.log_every", "0", ">= 1"},
      {"train.eval_every", "-1", ">= 0"},
      {"optimizer.lr", "0", "> 0"},
      {"optimizer.lr", "-1e-3", "> 0"},
      {"optimizer.weight_decay", "-0.1", ">= 0"},
      {"optimizer.beta1", "1.0", "in [0, 1)"},
      {"optimizer.beta2", "-0.1", "in [0, 1)"},
      {"optimizer.eps", "0", "> 0"},
      {"optimizer.momentum", "-1", ">= 0"},
      {"optimizer.grad_clip", "-1", ">= 0"},
      {"schedule.warmup_steps", "-1", ">= 0"},
      {"schedule.min_lr", "-1", ">= 0"},
      {"schedule.step_size", "0", ">= 1"},
      {"schedule.gamma", "0", "> 0"},
      {"precision.init_scale", "0", "in (0, 3.4028235e+38]"},
      {"precision.init_scale", "1e39", "in (0, 3.4028235e+38]"},
      {"precision.growth_factor", "1.0", "> 1"},
      {"precision.backoff_factor", "1.0", "in (0, 1)"},
      {"precision.backoff_factor", "0", "in (0, 1)"},
      {"precision.growth_interval", "0", ">= 1"},
      {"precision.max_skipped_steps", "0", ">= 1"},
      {"model.label_smoothing", "1.0", "in [0, 1)"},
      {"model.label_smoothing", "-0.1", "in [0, 1)"},
      {"data.features", "\"\"", "an HDF5 dataset path"},
      {"run.output", "\"\"", "a directory path"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    const auto error = error_of(deck_with(c.key, c.value));
    EXPECT_CONTAINS(error.message, "decks/test.toml:2:1: " + c.key + " must be " + c.rule + " (got ");
  }
  // The edges that are allowed.
  EXPECT_NO_THROW(parse(deck_with("optimizer.beta1", "0")));
  EXPECT_NO_THROW(parse(deck_with("optimizer.weight_decay", "0")));
  EXPECT_NO_THROW(parse(deck_with("precision.growth_interval", "1")));
  EXPECT_NO_THROW(parse(deck_with("run.threads", "0")));
}

TEST(RunConfigErrors, ClassWeightsAndLabelSmoothing) {
  for (const std::string value : {"[1, 0, 2]", "[1, -0.5]"}) {
    SCOPED_TRACE(value);
    const auto error = error_of(deck_with("model.class_weights", value));
    EXPECT_CONTAINS(error.message, "decks/test.toml:2:1: model.class_weights[");
    EXPECT_CONTAINS(error.message, "a class weight must be a positive finite number");
    EXPECT_FALSE(error.hint.empty());
  }
  for (const std::string value : {"[nan, 1]", "[1, inf]"})  // the reader's own check of numbers
    EXPECT_CONTAINS(error_of(deck_with("model.class_weights", value)).message,
                    "decks/test.toml:2:1: model.class_weights must be finite numbers");
  EXPECT_CONTAINS(error_of(deck_with("model.label_smoothing", "nan")).message,
                  "decks/test.toml:2:1: model.label_smoothing must be a finite number");
  for (const std::string key : {"class_weights = [1, 2]", "label_smoothing = 0.1"}) {
    const auto error = error_of(deck_with("model.loss", "\"mse\"\n" + key));
    EXPECT_CONTAINS(error.message,
                    "decks/test.toml:3:1: model." + key.substr(0, key.find(' ')) + " is set but model.loss = \"mse\"");
  }
  const RunConfig config = parse(deck_with("model.class_weights", "[0.5, 2, 1e-3]\nlabel_smoothing = 0.1"));
  EXPECT_EQ(config.model.class_weights, (std::vector<double>{0.5, 2, 1e-3}));
  EXPECT_EQ(config.model.label_smoothing, 0.1);
  EXPECT_NO_THROW(parse(deck_with("model.label_smoothing", "0")));
}

TEST(RunConfigErrors, Enumerations) {
  struct Case {
    std::string key, value, valid, suggestion;
  };
  const std::vector<Case> cases = {
      {"run.device", "\"gpu\"", "cpu, cuda, auto", "cuda"},
      {"run.device", "\"cuda:0\"", "cpu, cuda, auto", "cuda"},
      {"model.loss", "\"crossentropy\"", "cross_entropy, mse", "cross_entropy"},
      {"optimizer.type", "\"adam\"", "adamw, sgd", "adamw"},
      {"schedule.type", "\"linear\"", "constant, cosine, step", ""},
      {"precision.mode", "\"fp8\"", "fp32, bf16, fp16", ""},
      {"precision.mode", "\"BF16\"", "fp32, bf16, fp16", "bf16"},
      {"precision.mode", "\"bfloat16\"", "fp32, bf16, fp16", "bf16"},
  };
  for (const auto& c : cases) {
    const auto error = error_of(deck_with(c.key, c.value));
    EXPECT_CONTAINS(error.message, "decks/test.toml:2:1: " + c.key + " must be one of " + c.valid + " (got " + c.value);
    if (!c.suggestion.empty()) EXPECT_CONTAINS(error.message, "did you mean '" + c.suggestion + "'?");
  }
  for (const std::string value : {"\"-1\"", "0", "\"big\"", "\"dynamc\"", "1e39"}) {
    const auto error = error_of(deck_with("precision.loss_scale", value));
    EXPECT_CONTAINS(error.message,
                    "decks/test.toml:2:1: precision.loss_scale must be auto, dynamic, none or a positive "
                    "number");
  }
  EXPECT_CONTAINS(error_of(deck_with("precision.loss_scale", "\"dynamc\"")).message, "did you mean 'dynamic'?");
}

TEST(RunConfigErrors, StepsAndEpochs) {
  const auto neither = error_of("[data]\ntrain = \"a.h5\"\n[[model.layers]]\ntype = \"relu\"\n");
  EXPECT_CONTAINS(neither.message, "decks/test.toml: train.steps and train.epochs are both 0");
  const auto zero = error_of("[data]\ntrain = \"a.h5\"\n[train]\nsteps = 0\n[[model.layers]]\ntype = \"relu\"\n");
  EXPECT_CONTAINS(zero.message, "decks/test.toml:4:1: train.steps and train.epochs are both 0");
  const auto both = error_of(deck_with("train.epochs", "3"));
  EXPECT_CONTAINS(both.message, "decks/test.toml:2:1: train.steps (100) and train.epochs (3) are both set");
}

TEST(RunConfigErrors, RelationsBetweenKeys) {
  const auto nesterov = error_of("[optimizer]\ntype = \"sgd\"\nnesterov = true\n" + minimal_body);
  EXPECT_CONTAINS(nesterov.message, "decks/test.toml:3:1: optimizer.nesterov = true needs optimizer.momentum > 0");
  const auto min_lr = error_of("[schedule]\ntype = \"cosine\"\nmin_lr = 0.5\n" + minimal_body);
  EXPECT_CONTAINS(min_lr.message, "decks/test.toml:3:1: schedule.min_lr (0.5) is larger than optimizer.lr (0.001)");
}

TEST(RunConfigErrors, DataTrainMissing) {
  const auto error = error_of("[train]\nsteps = 1\n[[model.layers]]\ntype = \"relu\"\n");
  EXPECT_CONTAINS(error.message, "decks/test.toml: data.train is missing");
  EXPECT_CONTAINS(error.hint, "train = ");
}

TEST(RunConfigErrors, Layers) {
  const std::string head = "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n";  // 4 lines
  struct Case {
    std::string layers;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"", "decks/test.toml: model.layers is missing: the model needs at least one layer"},
      {"[model]\nlayers = []\n", "decks/test.toml:6:1: model.layers is empty"},
      {"[model.layers]\ntype = \"relu\"\n",
       "decks/test.toml:5:8: model.layers must be an array of tables, got a table"},
      {"[model]\nlayers = [1]\n", "decks/test.toml:6:11: model.layers[0] must be a table, got an integer"},
      {"[[model.layers]]\nout = 3\n", "decks/test.toml:5:1: model.layers[0] has no type"},
      {"[[model.layers]]\ntype = \"conv\"\n",
       "decks/test.toml:6:1: model.layers[0].type must be one of linear, relu, gelu, tanh, leaky_relu, layernorm, "
       "dropout, conv2d, conv3d, maxpool2d, maxpool3d, avgpool2d, avgpool3d, global_avgpool, flatten, groupnorm, "
       "embedding, attention, residual, transformer_block, sequence_pool, to_sequence (got "
       "\"conv\")"},
      {"[[model.layers]]\ntype = \"attention\"\ncausal = false\n",
       "decks/test.toml:5:1: model.layers[0] (attention) needs heads"},
      {"[[model.layers]]\ntype = \"attention\"\nheads = 0\n",
       "decks/test.toml:7:1: model.layers[0].heads must be >= 1"},
      {"[[model.layers]]\ntype = \"attention\"\nheads = 2\ndropout = 1.5\n",
       "model.layers[0].dropout must be in [0, 1)"},
      {"[[model.layers]]\ntype = \"linear\"\nout = 3\nheads = 2\n",
       "model.layers[0].heads does not apply to a linear layer (heads is for attention and transformer_block layers)"},
      {"[[model.layers]]\ntype = \"linear\"\nout = 3\nclass_token = true\n",
       "decks/test.toml:8:1: model.layers[0].class_token does not apply to a linear layer (class_token is for "
       "to_sequence layers)"},
      {"[[model.layers]]\ntype = \"to_sequence\"\npositions = 1\n", "model.layers[0].positions must be a boolean"},
      {"[[model.layers]]\ntype = \"gelu\"\napproximate = \"fast\"\n",
       "decks/test.toml:7:1: model.layers[0].approximate must be one of none, tanh (got \"fast\")"},
      {"[[model.layers]]\ntype = \"gelu\"\napproximate = true\n", "model.layers[0].approximate must be a string"},
      {"[[model.layers]]\ntype = \"relu\"\napproximate = \"tanh\"\n",
       "model.layers[0].approximate does not apply to a relu layer"},
      {"[[model.layers]]\ntype = \"Relu\"\n", "did you mean 'relu'?"},
      {"[[model.layers]]\ntype = \"dense\"\nout = 2\n", "did you mean 'linear'?"},
      {"[[model.layers]]\ntype = \"linear\"\nout = 3\np = 0.5\n",
       "decks/test.toml:8:1: model.layers[0].p does not apply to a linear layer (p is for dropout layers)"},
      {"[[model.layers]]\ntype = \"relu\"\neps = 1e-3\n",
       "decks/test.toml:7:1: model.layers[0].eps does not apply to a relu layer (eps is for layernorm and groupnorm "
       "layers)"},
      // Convolution and pooling keys.
      {"[[model.layers]]\ntype = \"conv2d\"\nkernel = 3\n",
       "decks/test.toml:5:1: model.layers[0] (conv2d) needs out, its number of output channels"},
      {"[[model.layers]]\ntype = \"conv3d\"\nout = 4\n", "decks/test.toml:5:1: model.layers[0] (conv3d) needs kernel"},
      {"[[model.layers]]\ntype = \"maxpool2d\"\nkernel = \"3\"\n",
       "decks/test.toml:7:1: model.layers[0].kernel must be an integer or an array of integers, got a string"},
      {"[[model.layers]]\ntype = \"conv2d\"\nout = 4\nkernel = [3, 3.5]\n",
       "model.layers[0].kernel[1] must be an integer, got a float"},
      {"[[model.layers]]\ntype = \"conv2d\"\nout = 4\nkernel = []\n",
       "model.layers[0].kernel must be an integer or an array of integers, got an array"},
      {"[[model.layers]]\ntype = \"conv3d\"\nout = 4\nkernel = [3, 3]\n",
       "decks/test.toml:8:1: model.layers[0].kernel has 2 values; a conv3d layer has 3 spatial axes"},
      {"[[model.layers]]\ntype = \"conv2d\"\nout = 4\nkernel = 3\nstride = 0\n",
       "decks/test.toml:9:1: model.layers[0].stride must be >= 1 (got 0)"},
      {"[[model.layers]]\ntype = \"conv2d\"\nout = 4\nkernel = 3\npadding = [1, -1]\n",
       "model.layers[0].padding must be >= 0 (got [1, -1])"},
      {"[[model.layers]]\ntype = \"conv2d\"\nout = 4\nkernel = 3\ngroups = 0\n", "model.layers[0].groups must be >= 1"},
      {"[[model.layers]]\ntype = \"avgpool2d\"\nkernel = 2\npadding = 2\n",
       "model.layers[0].padding (2) is more than half the kernel (2)"},
      {"[[model.layers]]\ntype = \"maxpool2d\"\nkernel = 2\ndilation = 2\n",
       "model.layers[0].dilation does not apply to a maxpool2d layer (dilation is for conv2d and conv3d layers)"},
      {"[[model.layers]]\ntype = \"groupnorm\"\n", "decks/test.toml:5:1: model.layers[0] (groupnorm) needs groups"},
      {"[[model.layers]]\ntype = \"flatten\"\nkernel = 2\n",
       "model.layers[0].kernel does not apply to a flatten layer"},
      {"[[model.layers]]\ntype = \"linear\"\n", "decks/test.toml:5:1: model.layers[0] (linear) needs out"},
      {"[[model.layers]]\ntype = \"linear\"\nouts = 3\n",
       "decks/test.toml:7:1: unknown key 'model.layers[0].outs'; did you mean 'model.layers[0].out'?"},
      {"[[model.layers]]\ntype = \"linear\"\nout = 0\n",
       "decks/test.toml:7:1: model.layers[0].out must be >= 1 (got 0)"},
      {"[[model.layers]]\ntype = \"linear\"\nout = 2\nin = -1\n",
       "decks/test.toml:8:1: model.layers[0].in must be >= 0"},
      {"[[model.layers]]\ntype = \"dropout\"\np = 1.0\n",
       "decks/test.toml:7:1: model.layers[0].p must be in [0, 1) (got 1)"},
      {"[[model.layers]]\ntype = \"dropout\"\np = -0.1\n", "model.layers[0].p must be in [0, 1)"},
      {"[[model.layers]]\ntype = \"layernorm\"\neps = 0\n", "decks/test.toml:7:1: model.layers[0].eps must be > 0"},
      {"[[model.layers]]\ntype = \"linear\"\nout = \"3\"\n",
       "decks/test.toml:7:1: model.layers[0].out must be an integer, got a string"},
      {"[[model.layers]]\ntype = \"relu\"\nname = \"a b\"\n",
       "decks/test.toml:7:1: model.layers[0].name must be made of letters, digits, _ and -"},
      {"[[model.layers]]\ntype = \"relu\"\nname = \"act\"\n[[model.layers]]\ntype = \"gelu\"\nname = \"act\"\n",
       "decks/test.toml:10:1: duplicate layer name 'act': model.layers[1] and model.layers[0] (decks/test.toml:5:1) "
       "both use it"},
      // A default name ("relu1") taken by an explicit one.
      {"[[model.layers]]\ntype = \"gelu\"\nname = \"relu1\"\n[[model.layers]]\ntype = \"relu\"\n",
       "decks/test.toml:8:1: duplicate layer name 'relu1'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.layers);
    const auto error = error_of(head + c.layers);
    EXPECT_CONTAINS(error.message, c.expected);
  }
  // The allowed edges.
  EXPECT_NO_THROW(parse(head + "[[model.layers]]\ntype = \"residual\"\nlayers = [{type = \"relu\"}]\n"));
  EXPECT_NO_THROW(parse(head + "[[model.layers]]\ntype = \"dropout\"\np = 0\n"));
  EXPECT_NO_THROW(parse(head + "[[model.layers]]\ntype = \"maxpool3d\"\nkernel = [1, 2, 3]\npadding = [0, 1, 1]\n"));
  EXPECT_NO_THROW(parse(head + "[[model.layers]]\ntype = \"leaky_relu\"\nnegative_slope = 0\n"));
}

TEST(RunConfigErrors, ResidualBlocks) {
  const std::string head =
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[[model.layers]]\ntype = \"residual\"\n";  // 6 lines
  struct Case {
    std::string block;
    std::string expected;
    std::string hint;
  };
  const std::vector<Case> cases = {
      {"",
       "decks/test.toml:5:1: model.layers[0] (residual) has no layers: a residual block adds the output of its layers "
       "to its input",
       "add the branch, e.g. layers = [{type = \"linear\", out = 64}, {type = \"relu\"}]"},
      {"layers = []\n", "decks/test.toml:7:1: model.layers[0] (residual) has an empty branch", ""},
      {"layers = {type = \"relu\"}\n",
       "decks/test.toml:7:1: model.layers[0].layers must be an array of tables, got a table", "inline tables"},
      {"layers = [{type = \"relu\"}, 3]\n",
       "decks/test.toml:7:28: model.layers[0].layers[1] must be a table, got an integer", ""},
      {"layers = [{type = \"linear\", outs = 3}]\n",
       "decks/test.toml:7:29: unknown key 'model.layers[0].layers[0].outs'; did you mean "
       "'model.layers[0].layers[0].out'?",
       ""},
      {"layers = [{type = \"linear\", out = 0}]\n",
       "decks/test.toml:7:29: model.layers[0].layers[0].out must be >= 1 (got 0)", ""},
      {"layers = [{type = \"relu\", p = 0.1}]\n", "model.layers[0].layers[0].p does not apply to a relu layer", ""},
      {"layers = [{out = 3}]\n", "decks/test.toml:7:11: model.layers[0].layers[0] has no type", ""},
      {"layers = [{type = \"residual\", layers = [{type = \"relu\"}]}]\n",
       "decks/test.toml:7:11: model.layers[0].layers[0] is a residual block inside the residual block model.layers[0]: "
       "nested residual blocks are not supported yet",
       "move it out of model.layers[0]"},
      {"layers = [{type = \"relu\", name = \"a\"}, {type = \"tanh\", name = \"a\"}]\n",
       "decks/test.toml:7:56: duplicate layer name 'a': model.layers[0].layers[1] and model.layers[0].layers[0]", ""},
      {"layers = [{type = \"relu\", name = \"a.b\"}]\n",
       "model.layers[0].layers[0].name must be made of letters, digits, _ and -", ""},
      {"out = 3\nlayers = [{type = \"relu\"}]\n", "model.layers[0].out does not apply to a residual layer", ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.block);
    const auto error = error_of(head + c.block);
    EXPECT_CONTAINS(error.message, c.expected);
    EXPECT_CONTAINS(error.hint, c.hint);
  }
  // One layer inside a block cannot be --set yet; the whole branch can.
  const std::string deck = head + "layers = [{type = \"linear\", out = 3}]\n";
  EXPECT_CONTAINS(error_of(deck, {"model.layers[0].layers[0].out=4"}).message,
                  "--set model.layers[0].layers[0].out=4: --set cannot change one layer inside a residual block yet");
  const RunConfig replaced = parse(deck, {"model.layers[0].layers=[{type = \"linear\", out = 4}, {type = \"relu\"}]"});
  ASSERT_EQ(replaced.model.layers[0].layers.size(), 2u);
  EXPECT_EQ(replaced.model.layers[0].layers[0].out, 4);
  // A branch written as [[model.layers.layers]] tables after the block's table.
  const RunConfig tables = parse(
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n[[model.layers]]\ntype = \"residual\"\n"
      "[[model.layers.layers]]\ntype = \"linear\"\nout = 3\n[[model.layers.layers]]\ntype = "
      "\"relu\"\n");
  ASSERT_EQ(tables.model.layers.size(), 1u);
  ASSERT_EQ(tables.model.layers[0].layers.size(), 2u);
  EXPECT_EQ(tables.model.layers[0].name, "residual0");
  EXPECT_EQ(tables.model.layers[0].layers[1].name, "relu1");  // default names count within the block
  EXPECT_EQ(tables.model.layers[0].layers[0].position.line, 7);
}

TEST(RunConfigErrors, DataPipelineAndCheckpointRanges) {
  struct Case {
    std::string key, value, expected;
  };
  const std::vector<Case> cases = {
      {"data.shuffle", "\"locale\"",
       "data.shuffle must be one of global, none, local (got \"locale\"); did you mean 'local'?"},
      {"data.prefetch", "-1", "data.prefetch must be >= 0 (got -1)"},
      {"data.augment_crop_padding", "-1", "data.augment_crop_padding must be >= 0 (got -1)"},
      {"data.scale", "0", "data.scale must be a non-zero number (got 0)"},
      {"train.accumulate", "0", "train.accumulate must be >= 1 (got 0)"},
      {"train.time_limit", "\"1:60:00\"", "train.time_limit must be \"HH:MM:SS\""},
      {"train.time_limit", "\"12\"", "train.time_limit must be \"HH:MM:SS\""},
      {"train.time_limit", "\"0:00\"", "train.time_limit must be \"HH:MM:SS\""},
      {"train.time_limit", "\"1:2:3\"", "train.time_limit must be \"HH:MM:SS\""},
      {"train.time_limit", "\"1:00:00:00\"", "train.time_limit must be \"HH:MM:SS\""},
      {"checkpoint.every_steps", "-5", "checkpoint.every_steps must be >= 0 (got -5)"},
      {"checkpoint.every_seconds", "-0.5", "checkpoint.every_seconds must be >= 0 (got -0.5)"},
      {"checkpoint.keep", "-1", "checkpoint.keep must be >= 0 (got -1)"},
      {"checkpoint.on_signal", "[\"USR1\", \"KILL\"]",
       "checkpoint.on_signal must be one of USR1, USR2, TERM, INT, HUP (got \"KILL\")"},
      {"checkpoint.on_signal", "[\"USR1\", 2]", "checkpoint.on_signal[1] must be a string, got an integer (2)"},
      {"data.mean", "[1, \"2\"]", "data.mean[1] must be a number, got a string"},
      {"data.mean", "[1, 2]", "data.mean has 2 values but data.std has 0"},
      {"data.std", "[1, 0]\nmean = [0, 0]", "data.std[1] is 0.0: a standard deviation must be positive"},
      {"data.std", "[1, -2]\nmean = [0, 0]", "data.std[1] is -2.0: a standard deviation must be positive"},
      {"data.normalize", "\"s.h5\"\nmean = [0]\nstd = [1]", "data.normalize and data.mean/data.std are both set"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    const auto error = error_of(deck_with(c.key, c.value));
    EXPECT_CONTAINS(error.message, "decks/test.toml:2:1: " + c.expected);
  }
  for (const std::string good : {"\"48:00:00\"", "\"90:00\"", "\"0:00:01\"", "\"\""})
    EXPECT_NO_THROW(parse(deck_with("train.time_limit", good))) << good;
}

TEST(RunConfigOverrides, TypesAndBareWords) {
  const RunConfig config = parse(minimal_body, {
                                                   "optimizer.lr=0.5",
                                                   "train.steps=7",
                                                   "data.shuffle=false",
                                                   "precision.mode=bf16",        // bare word
                                                   "run.output=runs/exp-1",      // bare path
                                                   "run.device=\"cuda\"",        // quoted string
                                                   "data.labels='/y'",           // literal string
                                                   "data.features=2024",         // a string key keeps the text
                                                   "optimizer.weight_decay=1",   // integer for a float
                                                   "precision.loss_scale=1024",  // a number
                                                   " schedule.type = cosine ",   // spaces around
                                                   "run.seed=1",
                                                   "run.seed=2",  // the last one wins
                                                   "data.validation=",
                                               });
  EXPECT_EQ(config.optimizer.lr, 0.5);
  EXPECT_EQ(config.train.steps, 7);
  EXPECT_EQ(config.data.shuffle, ShuffleMode::none);
  EXPECT_EQ(config.precision.mode, PrecisionMode::bf16);
  EXPECT_EQ(config.run.output, "runs/exp-1");
  EXPECT_EQ(config.run.device, Device::cuda);
  EXPECT_EQ(config.data.labels, "/y");
  EXPECT_EQ(config.data.features, "2024");
  EXPECT_EQ(config.optimizer.weight_decay, 1.0);
  EXPECT_EQ(config.precision.loss_scale, LossScaleSetting{FixedLossScale{1024}});
  EXPECT_EQ(config.schedule.type, ScheduleKind::cosine);
  EXPECT_EQ(config.run.seed, 2u);
  EXPECT_TRUE(config.data.validation.empty());
  // A key given by --set has no deck position, even when the deck also wrote it.
  EXPECT_EQ(config.positions.count("train.steps"), 0u);
  EXPECT_EQ(config.where("train.steps"), deck_path);
  EXPECT_EQ(config.where("data.train"), "decks/test.toml:2:1");
}

TEST(RunConfigOverrides, Errors) {
  struct Case {
    std::string override_text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"optimizer.learning_rate=0.1",
       "--set optimizer.learning_rate=0.1: unknown key 'optimizer.learning_rate'; did you mean 'optimizer.lr'?"},
      {"optimiser.lr=0.1", "--set optimiser.lr=0.1: unknown section '[optimiser]'; did you mean '[optimizer]'?"},
      {"lr=0.1", "--set lr=0.1: 'lr' is not a section.key name"},
      {"optimizer.lr", "--set optimizer.lr: expected section.key=value"},
      {"data.batch_size=abc", "--set data.batch_size=abc: data.batch_size must be an integer, got a string (\"abc\")"},
      {"optimizer.lr=-1", "--set optimizer.lr=-1: optimizer.lr must be > 0 (got -1)"},
      {"precision.mode=fp8", "--set precision.mode=fp8: precision.mode must be one of fp32, bf16, fp16"},
      {"train.epochs=2", "--set train.epochs=2: train.steps (100) and train.epochs (2) are both set"},
      {"model.layers[0].size=3", "unknown key 'model.layers[0].size'"},
      {"model.layers[0].outs=3",
       "--set model.layers[0].outs=3: unknown key 'model.layers[0].outs'; did you mean 'model.layers[0].out'?"},
      {"model.layers[4].out=3", "--set model.layers[4].out=3: there is no model.layers[4]: the deck defines 1 layer"},
      {"model.layers[x].out=3", "'model.layers[x].out' is not a layer key"},
      {"model.layers[0].p=0.2", "--set model.layers[0].p=0.2: model.layers[0].p does not apply to a linear layer"},
      {"model.layers=3", "--set model.layers=3: model.layers must be an array of tables, got an integer"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.override_text);
    EXPECT_CONTAINS(error_of(minimal_body, {c.override_text}).message, c.expected);
  }
}

TEST(RunConfigOverrides, Layers) {
  const std::string deck =
      "[data]\ntrain = \"a.h5\"\n[train]\nsteps = 1\n"
      "[[model.layers]]\ntype = \"linear\"\nout = 64\n"
      "[[model.layers]]\ntype = \"relu\"\n"
      "[[model.layers]]\ntype = \"linear\"\nout = 10\n";
  const RunConfig config =
      parse(deck, {"model.layers[2].out=128", "model.layers[0].bias=false", "model.layers[1].name=act"});
  EXPECT_EQ(config.model.layers[2].out, 128);
  EXPECT_FALSE(config.model.layers[0].bias);
  EXPECT_EQ(config.model.layers[1].name, "act");
  EXPECT_EQ(config.positions.count("model.layers[2].out"), 0u);
  EXPECT_EQ(config.positions.at("model.layers[0].out").line, 7);

  // Changing a layer's type re-checks its keys against the new type.
  EXPECT_CONTAINS(error_of(deck, {"model.layers[0].type=gelu"}).message,
                  "decks/test.toml:7:1: model.layers[0].out does not apply to a gelu layer");

  const RunConfig replaced = parse(deck, {"model.layers=[{type=\"linear\", out=5}, {type=\"tanh\"}]"});
  ASSERT_EQ(replaced.model.layers.size(), 2u);
  EXPECT_EQ(replaced.model.layers[0].out, 5);
  EXPECT_EQ(replaced.model.layers[1].name, "tanh1");
  EXPECT_EQ(replaced.positions.count("model.layers[0].out"), 0u);
}

}  // namespace
}  // namespace hpctrain
