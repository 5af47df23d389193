// `hpctrain generate`: autoregressive sampling from a language model checkpoint (an embedding first, logits over the
// vocabulary at every position), on one rank, with the key/value cache of nn/generation.hpp.
#include <hdf5.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "data_tools.hpp"
#include "hpctrain/app/command_line.hpp"
#include "hpctrain/app/commands.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/nn/generation.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/precision/policy.hpp"
#include "hpctrain/train/backend_choice.hpp"
#include "hpctrain/train/checkpointing.hpp"
#include "hpctrain/train/rank_resources.hpp"

namespace hpctrain {

namespace {

const char* const generate_usage =
    "usage: hpctrain generate CHECKPOINT.h5 (--prompt TEXT | --prompt-ids ID,ID,...) --max-new-tokens N\n"
    "                         [--temperature T] [--top-k K] [--seed S] [--output F.h5] [--force]\n"
    "                         [--device cpu|cuda|auto] [--no-cache]\n"
    "\n"
    "CHECKPOINT.h5 may also be a run directory or its checkpoints/latest or checkpoints/best.\n"
    "Continue a prompt with N tokens sampled from the checkpoint's language model (its first layer an embedding, its\n"
    "output the logits over the vocabulary at every position), one after another, on one rank.\n"
    "  --prompt TEXT       byte-level models (vocabulary 256): the bytes of TEXT are the prompt's ids\n"
    "  --prompt-ids LIST   any vocabulary: the prompt's token ids, separated by commas\n"
    "  --temperature T     the logits are divided by T before the softmax (default 1); 0: always the most likely\n"
    "                      token (greedy)\n"
    "  --top-k K           draw among the K most likely tokens only (default: the whole vocabulary)\n"
    "  --seed S            the draw of the token at position p is the counter-based random number of (S, p): a seed\n"
    "                      gives the same tokens on any machine (default 1)\n"
    "  --output F.h5       also write /prompt and /generated (int32 ids) with the attributes seed, temperature, top_k\n"
    "                      and checkpoint (never over an existing file without --force)\n"
    "  --no-cache          recompute the whole window for every token instead of keeping the keys and values of past\n"
    "                      positions (the reference the cache is tested against)\n"
    "The model sees at most T tokens (its sequence length): a longer sequence keeps its last T, and from then on each\n"
    "token recomputes the window. Byte-level models print text (bytes other than printable ASCII, newline and tab as\n"
    "\\xHH, the backslash as \\\\); other models print the ids, separated by spaces.\n"
    "--device runs it on the CPU, the GPU or whichever the node has (default: the deck's run.device).\n";

struct GenerateArguments {
  std::string checkpoint, prompt_text, prompt_ids, output;
  std::int64_t max_new_tokens = 0;
  SamplingOptions sampling;
  bool top_k_given = false, force = false, use_cache = true;
  std::vector<std::string> overrides;
};

std::optional<GenerateArguments> parse_generate_arguments(const Arguments& args, const MpiEnvironment& mpi) {
  const CommandLine line(args, "hpctrain generate",
                         {{"--prompt", true},
                          {"--prompt-ids", true},
                          {"--max-new-tokens", true},
                          {"--temperature", true},
                          {"--top-k", true},
                          {"--seed", true},
                          {"--output", true},
                          {"--force", false},
                          {"--device", true},
                          {"--no-cache", false}});
  if (print_help_if_asked(line, generate_usage, mpi)) return std::nullopt;
  const auto& words = line.positionals();
  HPCTRAIN_VERIFY(words.size() <= 1, InputError,
                  line.command() << ": unexpected argument '" << words[words.size() - 1] << "'", line.help_hint());
  HPCTRAIN_VERIFY(words.size() == 1 && line.has("--max-new-tokens") && line.has("--prompt") != line.has("--prompt-ids"),
                  InputError,
                  line.command() << ": needs a checkpoint, --prompt TEXT or --prompt-ids LIST (one of them), "
                                    "and --max-new-tokens N",
                  "usage: " + line.command() + " CHECKPOINT.h5 --prompt TEXT --max-new-tokens N");
  GenerateArguments parsed;
  parsed.checkpoint = resolve_checkpoint(words[0]).string();
  parsed.prompt_text = line.value_or("--prompt", "");
  parsed.prompt_ids = line.value_or("--prompt-ids", "");
  HPCTRAIN_VERIFY(!(line.has("--prompt") ? parsed.prompt_text : parsed.prompt_ids).empty(), InputError,
                  line.command() << ": the prompt is empty", "give at least one token to continue");
  parsed.max_new_tokens = line.integer<std::int64_t>("--max-new-tokens");
  HPCTRAIN_VERIFY(parsed.max_new_tokens >= 0, InputError,
                  line.command() << ": --max-new-tokens " << parsed.max_new_tokens << " is negative", line.help_hint());
  if (line.has("--temperature")) parsed.sampling.temperature = line.number("--temperature");
  HPCTRAIN_VERIFY(std::isfinite(parsed.sampling.temperature) && parsed.sampling.temperature >= 0.0, InputError,
                  line.command() << ": --temperature " << line.value("--temperature") << " is not a number >= 0",
                  "0 picks the most likely token; 1 samples from the model's distribution");
  parsed.top_k_given = line.has("--top-k");
  if (parsed.top_k_given) parsed.sampling.top_k = line.integer<std::int64_t>("--top-k");
  parsed.sampling.seed = line.has("--seed") ? line.integer<std::uint64_t>("--seed") : 1;
  parsed.output = line.value_or("--output", "");
  parsed.force = line.has("--force");
  parsed.use_cache = !line.has("--no-cache");
  if (line.has("--device")) parsed.overrides.push_back(device_override(line));
  return parsed;
}

// "3,17,42" -> ids, each in [0, vocabulary).
std::vector<std::int32_t> parse_prompt_ids(const std::string& text, std::int64_t vocabulary) {
  std::vector<std::int32_t> ids;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string word = text.substr(begin, end - begin);
    std::int64_t id = -1;
    std::size_t used = 0;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HPCTRAIN_VERIFY(used == word.size() && used > 0, InputError,
                    "hpctrain generate: --prompt-ids: '" << word << "' is not a token id",
                    "give ids separated by commas, e.g. --prompt-ids 3,17,42");
    HPCTRAIN_VERIFY(
        id >= 0 && id < vocabulary, InputError,
        "hpctrain generate: --prompt-ids: id " << id << " is outside the model's vocabulary [0, " << vocabulary << ")",
        "give ids the model was trained on");
    ids.push_back(static_cast<std::int32_t>(id));
    begin = end + 1;
  }
  return ids;
}

// A byte as printable text: printable ASCII, newline and tab as they are, the backslash doubled, others as \xHH.
std::string printable_byte(std::int32_t id) {
  if (id == '\\') return "\\\\";
  if ((id >= 0x20 && id < 0x7f) || id == '\n' || id == '\t') return std::string(1, static_cast<char>(id));
  char escaped[8];
  std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned>(id) & 0xffu);
  return escaped;
}

// Written under a temporary name and committed (core/files.hpp), after refuse_to_overwrite checked the name.
void write_generation_file(const GenerateArguments& arguments, const std::vector<std::int32_t>& tokens,
                           std::size_t prompt_length) {
  write_file_atomically(arguments.output, [&](const std::string& temporary) {
    H5Handle file = create_file(temporary);
    auto write = [&](const char* name, const std::int32_t* data, std::size_t count) {
      const hsize_t dims[1] = {static_cast<hsize_t>(count)};
      H5Handle space(HPCTRAIN_H5_CHECK(H5Screate_simple(1, dims, nullptr)));
      H5Handle dataset(HPCTRAIN_H5_CHECK(
          H5Dcreate2(file.get(), name, H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
      if (count > 0) HPCTRAIN_H5_CHECK(H5Dwrite(dataset.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
    };
    write("prompt", tokens.data(), prompt_length);
    write("generated", tokens.data() + prompt_length, tokens.size() - prompt_length);
    write_integer_attribute(file.get(), "seed", static_cast<std::int64_t>(arguments.sampling.seed));
    write_float_attribute(file.get(), "temperature", arguments.sampling.temperature);
    write_integer_attribute(file.get(), "top_k", arguments.sampling.top_k);
    write_string_attribute(file.get(), "checkpoint", arguments.checkpoint);
  });
}

}  // namespace

int generate_command(const Arguments& args, const MpiEnvironment& mpi) {
  const auto parsed = parse_generate_arguments(args, mpi);
  if (!parsed) return 0;
  GenerateArguments arguments = *parsed;
  HPCTRAIN_VERIFY(mpi.size() == 1, InputError,
                  "hpctrain generate decodes one sequence on one rank, but " << mpi.size() << " ranks were started",
                  "run it without mpiexec (or with -n 1)");
  if (!arguments.output.empty()) refuse_to_overwrite(arguments.output, arguments.force, mpi);

  // The checkpoint's deck and model, for one sample: a language model's first layer is an embedding.
  RunConfig config = parse_run_config(checkpoint_deck(arguments.checkpoint), arguments.checkpoint, arguments.overrides);
  const LayerSpec& first = config.model.layers.front();
  HPCTRAIN_VERIFY(first.type == LayerType::embedding, InputError,
                  "'" << arguments.checkpoint << "' holds a model whose first layer '" << first.name
                      << "' takes features, not token ids; generate needs a language model (an embedding first)",
                  "train a model on token data (docs/getting-started.md: train a small language model)");
  omp_set_num_threads(choose_thread_count(config, mpi));
  BackendChoice choice = choose_backend(config, mpi);
  if (!choice.fallback.empty())
    std::fprintf(stderr, "run.device = \"auto\": on the CPU (%s)\n", choice.fallback.c_str());
  Backend& backend = *choice.backend;
  const PrecisionPolicy precision = PrecisionPolicy::of(config.precision.mode);
  const std::int64_t window = checkpoint_input_features(arguments.checkpoint);
  Model model(config.model, SampleShape{window}, backend,
              ModelBuffers{precision.activations, precision.master, 1, false, 0, true}, arguments.checkpoint);
  const std::int64_t vocabulary = first.vocabulary, classes = model.classes();
  HPCTRAIN_VERIFY(model.positions() > 1 && classes <= vocabulary, InputError,
                  "'" << arguments.checkpoint << "': the model's output is not the logits of the next token at every "
                      << "position (its output has " << model.output_width() << " values per sample for " << window
                      << " positions, vocabulary " << vocabulary << ")",
                  "generate from a language model whose last layer maps each position to the vocabulary");
  load_parameters(arguments.checkpoint, model, backend, mpi);
  for (std::size_t i = 0; i < model.layer_count(); ++i)
    HPCTRAIN_VERIFY(!model.layer(i).reads_later_positions(), InputError,
                    "'" << arguments.checkpoint << "': layer '" << model.layer(i).name() << "' ("
                        << model.layer(i).type()
                        << ") lets each position see later ones (not causal), so the model cannot continue a prompt",
                    "generate from a causal language model");

  // The prompt and the options against the model.
  const bool byte_level = vocabulary == 256;
  std::vector<std::int32_t> prompt;
  if (!arguments.prompt_ids.empty()) {
    prompt = parse_prompt_ids(arguments.prompt_ids, classes);
  } else {
    HPCTRAIN_VERIFY(byte_level, InputError,
                    "hpctrain generate: --prompt gives text, but the model's vocabulary has " << vocabulary
                                                                                              << " ids, not 256 bytes",
                    "give the prompt's token ids with --prompt-ids ID,ID,...");
    for (const char byte : arguments.prompt_text) prompt.push_back(static_cast<unsigned char>(byte));
    HPCTRAIN_VERIFY(classes == 256 || *std::max_element(prompt.begin(), prompt.end()) < classes, InputError,
                    "hpctrain generate: the prompt has bytes above the model's " << classes << " output classes",
                    "use a prompt of the model's bytes");
  }
  HPCTRAIN_VERIFY(!arguments.top_k_given || (arguments.sampling.top_k >= 1 && arguments.sampling.top_k <= classes),
                  InputError,
                  "hpctrain generate: --top-k " << arguments.sampling.top_k << " is outside [1, " << classes
                                                << "] (the model's vocabulary)",
                  "choose K between 1 and " + std::to_string(classes) + ", or leave it out for the whole vocabulary");

  TokenGenerator generator(model, backend);
  DecodingPath path = arguments.use_cache ? DecodingPath::cached : DecodingPath::recomputed;
  if (const std::string reason = generator.cache_unavailable_reason();
      path == DecodingPath::cached && !reason.empty()) {
    std::fprintf(stderr,
                 "hpctrain generate: without the key/value cache (%s): the window is recomputed for every "
                 "token\n",
                 reason.c_str());
    path = DecodingPath::recomputed;
  }
  auto print = [&](std::int32_t id, bool first_id) {
    if (byte_level)
      std::fputs(printable_byte(id).c_str(), stdout);
    else
      std::printf(first_id ? "%d" : " %d", id);
  };
  for (std::size_t i = 0; i < prompt.size(); ++i) print(prompt[i], i == 0);
  std::fflush(stdout);
  const std::vector<std::int32_t> tokens =
      generator.generate(prompt, arguments.max_new_tokens, arguments.sampling, path, [&](std::int32_t id) {
        print(id, false);
        std::fflush(stdout);
      });
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (!arguments.output.empty()) write_generation_file(arguments, tokens, prompt.size());
  return 0;
}

}  // namespace hpctrain
