// `hpctrain data ...`: the data tools. generate writes a synthetic dataset, inspect describes a data file (with
// per-channel statistics), convert writes one from .npy or CSV, split carves out a validation set, plan prints which
// samples each rank reads at each step, bench measures how fast a deck's training data can be read.
//
// Every rank parses the command line (so a bad option is reported once, by rank 0, like every error all ranks see);
// only rank 0 touches files and prints, and the other ranks wait for it at a barrier (bench alone runs on every rank).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "hpctrain/app/commands.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/suggestions.hpp"
#include "hpctrain/data/batch_loader.hpp"
#include "hpctrain/data/channel_statistics.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/data/generate.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/data/sampler.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace {

const char* const data_usage =
    "usage: hpctrain data <sub-command> ...\n"
    "\n"
    "sub-commands:\n"
    "  generate KIND --samples N --output FILE.h5 [options]   write a synthetic dataset (blobs, spirals, regression,\n"
    "                                                         images, volumes)\n"
    "  inspect FILE.h5                                        describe a file: datasets, labels, per-channel "
    "statistics\n"
    "  convert --features X.npy --labels Y.npy --output F.h5  convert NumPy arrays (or --csv FILE.csv) to HDF5\n"
    "  split FILE.h5 --validation-fraction F ...              split a file into training and validation files\n"
    "  plan DECK.toml --ranks R [--epoch E]                   print the samples each rank reads at each step\n"
    "  bench DECK.toml [--steps N]                            measure how fast every rank reads its training batches\n"
    "\n"
    "Run 'hpctrain data <sub-command> --help' for details.\n";

const char* const generate_usage =
    "usage: hpctrain data generate KIND --samples N --output FILE.h5 [options]\n"
    "\n"
    "Write a synthetic dataset. Every value is a pure function of the options and the seed: the same command writes\n"
    "the same data.\n"
    "\n"
    "kinds:\n"
    "  blobs       C Gaussian clusters, centres uniform in [-10, 10]^F; --noise is each cluster's standard deviation\n"
    "  spirals     C interleaved spiral arms of radius 1; --noise is the standard deviation added to every feature;\n"
    "              with --features F > 2 the spirals lie in a random plane of R^F\n"
    "  regression  inputs x ~ N(0, 1)^F; K smooth nonlinear targets, each a sum of 4 random sine waves of x, plus\n"
    "              Gaussian noise of standard deviation --noise\n"
    "  images      (C, S, S) images, each holding one shape or texture (its class: cross, ring, square, horizontal\n"
    "              stripes, vertical stripes, diagonal cross, disc, checkerboard; --classes picks the first C of\n"
    "              these, at most 8) at a random place, size and brightness, plus pixel noise of std --noise\n"
    "  volumes     (C, S, S, S) fields for 3-D CNN regression: per channel a sum of 3 plane waves in random\n"
    "              directions; 3 targets in [-1, 1] set the field's amplitude, frequency and spectral slope\n"
    "              (CosmoFlow-like: recover the parameters from the field); pixel noise of std --noise\n"
    "\n"
    "options:\n"
    "  --samples N       number of samples (required)\n"
    "  --output FILE.h5  file to write (required); written as FILE.h5.partial and renamed when complete\n"
    "  --features F      values per sample (default 2; regression 4)\n"
    "  --classes C       number of classes, blobs and spirals (default 3)\n"
    "  --outputs K       targets per sample, regression (default 1)\n"
    "  --size S          edge length of images and volumes (default 16)\n"
    "  --channels C      channels of images and volumes (default 1)\n"
    "  --noise X         noise level (default: blobs 1, spirals 0.05, regression 0.1, images 0.2, volumes 0.05)\n"
    "  --seed S          random seed, 0 <= S < 2^63 (default 0)\n"
    "  --force           replace FILE.h5 if it exists\n"
    "  --help            show this help\n"
    "\n"
    "The file holds /features (N, F) float32 ((N, C, S, S) for images, (N, C, S, S, S) for volumes) and /labels (N)\n"
    "int32 in [0, C), or /targets (N, K) float32 for regression and volumes (K = 3), with the options recorded as\n"
    "attributes of the root.\n";

const char* const inspect_usage =
    "usage: hpctrain data inspect FILE.h5 [--features PATH] [--all-channels]\n"
    "\n"
    "Describe an HDF5 data file: every dataset (shape, stored type, chunking and compression), the number of\n"
    "samples, the range and number of distinct labels in /labels, min/max/mean/std of every feature channel, and\n"
    "the attributes of the root. The file is read in bounded blocks, so any size is fine.\n"
    "\n"
    "options:\n"
    "  --features PATH   the dataset to summarise per channel (default /features)\n"
    "  --all-channels    print every channel (default: the first 32)\n"
    "\n"
    "A channel is the second dimension: (N, F) has F channels, (N, C, H, W) has C channels of H x W values.\n"
    "std is the population standard deviation (numpy.std). NaN and Inf are counted apart and left out.\n";

const char* const convert_usage =
    "usage: hpctrain data convert --features X.npy (--labels Y.npy | --targets T.npy) --output FILE.h5 [options]\n"
    "       hpctrain data convert --csv FILE.csv (--label-column COL | --target-column COL) [--header]\n"
    "                             --output FILE.h5 [options]\n"
    "\n"
    "Write an HDF5 data file in hpctrain's layout from NumPy .npy arrays or a CSV file of numbers.\n"
    "\n"
    ".npy: the features keep their element type (float16/32/64, int8..64, uint8..64) and shape (N, ...); labels\n"
    "(N) or (N, 1) whole numbers become /labels int32; targets (N) or (N, K) become /targets float32. C order only.\n"
    "CSV: comma-separated numbers, one sample per line; the chosen column becomes /labels (N) int32 (whole numbers)\n"
    "or /targets (N, 1) float32, every other column /features (N, F) float32. Empty lines are skipped.\n"
    "\n"
    "options:\n"
    "  --features X.npy        features, shape (N, ...) with at least 2 dimensions\n"
    "  --labels Y.npy          class labels\n"
    "  --targets T.npy         regression targets\n"
    "  --csv FILE.csv          a CSV file instead of .npy arrays\n"
    "  --label-column COL      CSV: the class label column, by header name or index counted from 0 (-1 = last)\n"
    "  --target-column COL     CSV: a regression target column instead\n"
    "  --header                CSV: the first line names the columns\n"
    "  --output FILE.h5        file to write (required); written as FILE.h5.partial and renamed when complete\n"
    "  --compress              gzip level 4 with the shuffle filter (smaller files, slower random reads)\n"
    "  --force                 replace FILE.h5 if it exists\n"
    "\n"
    "Datasets are chunked along the sample axis in chunks of about 1 MiB of whole samples.\n";

const char* const split_usage =
    "usage: hpctrain data split FILE.h5 --validation-fraction F --train-output A.h5 --validation-output B.h5\n"
    "                           [--seed S] [--shuffle] [--compress] [--force]\n"
    "\n"
    "Split every per-sample dataset of FILE.h5 (those with as many rows as /features) into a training and a\n"
    "validation file. The validation set is the first round(F x N) samples of torch.randperm(N) with a generator\n"
    "seeded with S (default 0): the same seed gives the same split. Values keep their stored types.\n"
    "\n"
    "options:\n"
    "  --validation-fraction F   share of the samples for validation, 0 < F < 1\n"
    "  --seed S                  seed of the random split (default 0)\n"
    "  --shuffle                 write the samples in random order (for data.shuffle = \"local\"); default: file "
    "order\n"
    "  --compress                gzip level 4 with the shuffle filter\n"
    "  --force                   replace existing output files\n";

const char* const plan_usage =
    "usage: hpctrain data plan DECK.toml --ranks R [--epoch E] [--steps K] [--set section.key=value]...\n"
    "\n"
    "Print, for one epoch of the deck's training data, the global sample indices each of R ranks reads at each step,\n"
    "in the order it reads them: one line per (step, rank). Runs on one process: no need to start R ranks.\n"
    "With data.shuffle = true the order is PyTorch's DistributedSampler's (randperm seeded with run.seed + epoch,\n"
    "padded or truncated to a multiple of R, rank r taking every R-th index from r), so a PyTorch run can be\n"
    "checked against it; the global batch of a step is the same set of samples for any R.\n"
    "\n"
    "options:\n"
    "  --ranks R     number of ranks (required)\n"
    "  --epoch E     the epoch (default 0)\n"
    "  --steps K     print only the first K steps\n"
    "  --set k=v     override a deck key, as for 'hpctrain train' (repeatable)\n";

const char* const bench_usage =
    "usage: mpiexec -n R hpctrain data bench DECK.toml [--steps K] [--set section.key=value]...\n"
    "\n"
    "Read the deck's training batches exactly as 'hpctrain train' would on this many ranks (same sampler, files,\n"
    "transforms, data.prefetch, data.in_memory, data.shuffle), without training, and report per rank the staging time\n"
    "(data.in_memory, local shuffle) and the read throughput: bytes of batch data delivered (float32 features,\n"
    "labels/targets) per second of waiting for batches.\n"
    "\n"
    "options:\n"
    "  --steps K     batches to read per rank (default: one epoch)\n"
    "  --set k=v     override a deck key (repeatable), e.g. --set data.prefetch=0\n";

// --- command-line parsing ---

struct OptionSpec {
  std::string name;  // "--samples"
  bool takes_value;
  bool repeatable = false;  // --set: every occurrence is kept, in order
};

struct ParsedArguments {
  std::vector<std::string> positionals;
  std::map<std::string, std::string> values;                 // option -> value ("" for a flag)
  std::map<std::string, std::vector<std::string>> repeated;  // repeatable option -> its values
  bool help = false;

  [[nodiscard]] bool has(const std::string& option) const { return values.contains(option); }
};

ParsedArguments parse_arguments(const Arguments& args, const std::vector<OptionSpec>& options,
                                const std::string& command) {
  const std::string help_hint = "see '" + command + " --help'";
  ParsedArguments parsed;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      parsed.help = true;
      return parsed;  // help wins over anything else on the line
    }
    if (!arg.starts_with("-") || arg == "-") {
      parsed.positionals.push_back(arg);
      continue;
    }
    const std::size_t equals = arg.find('=');
    const std::string name = arg.substr(0, equals);
    const auto spec = std::find_if(options.begin(), options.end(), [&](const OptionSpec& o) { return o.name == name; });
    if (spec == options.end()) {
      std::vector<Suggestion> candidates;
      for (const OptionSpec& candidate : options) candidates.push_back({candidate.name, candidate.name});
      const auto suggestion = closest_name(name, candidates);
      throw InputError(command + ": unknown option '" + name + "'",
                       suggestion ? "did you mean '" + *suggestion + "'? " + help_hint : help_hint);
    }
    if (spec->repeatable) {
      if (equals != std::string::npos) {
        parsed.repeated[name].push_back(arg.substr(equals + 1));
      } else {
        HPCTRAIN_VERIFY(i + 1 < args.size(), InputError, command << ": " << name << " needs a value", help_hint);
        parsed.repeated[name].push_back(args[++i]);
      }
      continue;
    }
    HPCTRAIN_VERIFY(!parsed.has(name), InputError, command << ": " << name << " given twice", help_hint);
    if (!spec->takes_value) {
      HPCTRAIN_VERIFY(equals == std::string::npos, InputError, command << ": " << name << " takes no value", help_hint);
      parsed.values[name] = "";
    } else if (equals != std::string::npos) {
      parsed.values[name] = arg.substr(equals + 1);
    } else {
      HPCTRAIN_VERIFY(i + 1 < args.size(), InputError, command << ": " << name << " needs a value", help_hint);
      parsed.values[name] = args[++i];
    }
  }
  return parsed;
}

template <class Integer>
Integer parse_integer(const ParsedArguments& parsed, const std::string& option, const std::string& command) {
  const std::string& text = parsed.values.at(option);
  Integer value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  HPCTRAIN_VERIFY(error == std::errc() && end == text.data() + text.size() && !text.empty(), InputError,
                  command << ": " << option << " expects a whole number" << (std::is_unsigned_v<Integer> ? " >= 0" : "")
                          << ", got '" << text << "'",
                  "see '" + command + " --help'");
  return value;
}

double parse_number(const ParsedArguments& parsed, const std::string& option, const std::string& command) {
  const std::string& text = parsed.values.at(option);
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  HPCTRAIN_VERIFY(error == std::errc() && end == text.data() + text.size() && !text.empty(), InputError,
                  command << ": " << option << " expects a number, got '" << text << "'",
                  "see '" + command + " --help'");
  return value;
}

void wait_for_root(const MpiEnvironment& mpi) {
  // Rank 0 did the work; if it failed it ended the job (MPI_Abort) and nobody waits here for long.
  if (mpi.size() > 1) HPCTRAIN_MPI_CHECK(MPI_Barrier(mpi.world()));
}

std::string human_size(std::uintmax_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

// Writes `output` with write(path) under a temporary name and renames it when complete, so that a crash or a full disk
// never leaves a half-written file under the name a deck points at. Checks first that the directory exists and that
// `output` does not (unless force). `option` names the command-line option in messages.
void write_then_rename(const std::string& command, const std::string& option, const std::string& output, bool force,
                       const std::function<void(const std::string&)>& write) {
  namespace fs = std::filesystem;
  HPCTRAIN_VERIFY(!output.empty(), InputError, command << ": " << option << " is empty",
                  "see '" + command + " --help'");
  const fs::path output_path(output);
  const fs::path directory = output_path.has_parent_path() ? output_path.parent_path() : fs::path(".");
  HPCTRAIN_VERIFY(fs::is_directory(directory), InputError,
                  command << ": the directory of " << option << ", '" << directory.string() << "', does not exist",
                  "create it first (mkdir -p " + directory.string() + ")");
  HPCTRAIN_VERIFY(!fs::is_directory(output_path), InputError,
                  command << ": " << option << " '" << output << "' is a directory",
                  "name a file, e.g. " + output + "/data.h5");
  HPCTRAIN_VERIFY(!fs::exists(output_path) || force, InputError, command << ": '" << output << "' already exists",
                  "pass --force to replace it, or choose another " + option);
  const std::string partial = output + ".partial";
  try {
    write(partial);
  } catch (...) {
    std::error_code ignored;
    fs::remove(partial, ignored);
    throw;
  }
  std::error_code rename_error;
  fs::rename(partial, output_path, rename_error);
  if (rename_error) {
    std::error_code ignored;
    fs::remove(partial, ignored);
    throw InputError(command + ": cannot rename '" + partial + "' to '" + output + "': " + rename_error.message(), "",
                     ErrorScope::this_rank);
  }
}

// Every error of a data tool names the command: "hpctrain data convert: 'x.npy' is ...".
template <class Action>
auto with_command_context(const std::string& command, Action&& action) {
  try {
    return action();
  } catch (const InputError& error) {
    throw InputError(command + ": " + error.what(), error.hint(), error.scope());
  }
}

// --- data generate ---

int generate_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data generate";
  const ParsedArguments parsed = parse_arguments(args,
                                                 {{"--samples", true},
                                                  {"--features", true},
                                                  {"--classes", true},
                                                  {"--outputs", true},
                                                  {"--size", true},
                                                  {"--channels", true},
                                                  {"--noise", true},
                                                  {"--seed", true},
                                                  {"--output", true},
                                                  {"--force", false}},
                                                 command);
  if (parsed.help) {
    if (mpi.is_root()) std::fputs(generate_usage, stdout);
    return 0;
  }
  const std::string help_hint = "see '" + command + " --help'";
  HPCTRAIN_VERIFY(!parsed.positionals.empty(), InputError, command << ": no dataset kind given",
                  "the kinds are blobs, spirals, regression, images and volumes; " + help_hint);
  HPCTRAIN_VERIFY(parsed.positionals.size() == 1, InputError,
                  command << ": unexpected argument '" << parsed.positionals[1] << "' (one kind only)", help_hint);
  SyntheticKind kind{};
  try {
    kind = parse_synthetic_kind(parsed.positionals[0]);
  } catch (const InputError& error) {
    throw InputError(command + ": " + error.what(), error.hint());
  }
  const char* kind_name = synthetic_kind_name(kind);
  HPCTRAIN_VERIFY(parsed.has("--samples"), InputError, command << ": --samples N is required", help_hint);
  HPCTRAIN_VERIFY(parsed.has("--output"), InputError, command << ": --output FILE.h5 is required", help_hint);
  HPCTRAIN_VERIFY(!(is_classification(kind) && parsed.has("--outputs")), InputError,
                  command << ": --outputs applies to regression data, not " << kind_name << " (which has --classes)",
                  help_hint);
  HPCTRAIN_VERIFY(!(!is_classification(kind) && parsed.has("--classes")), InputError,
                  command << ": --classes applies to blobs, spirals and images, not " << kind_name
                          << (kind == SyntheticKind::regression ? " (which has --outputs)" : ""),
                  help_hint);
  HPCTRAIN_VERIFY(!(kind == SyntheticKind::volumes && parsed.has("--outputs")), InputError,
                  command << ": volumes always has 3 targets (amplitude, frequency, slope); --outputs does not apply",
                  help_hint);
  for (const char* option : {"--size", "--channels"})
    HPCTRAIN_VERIFY(
        is_spatial(kind) || !parsed.has(option), InputError,
        command << ": " << option << " applies to images and volumes, not " << kind_name << " (which has --features)",
        help_hint);
  HPCTRAIN_VERIFY(!(is_spatial(kind) && parsed.has("--features")), InputError,
                  command << ": " << kind_name << " samples are shaped by --size and --channels, not --features",
                  help_hint);

  SyntheticSpec spec = default_synthetic_spec(kind);
  spec.samples = parse_integer<std::int64_t>(parsed, "--samples", command);
  if (parsed.has("--features")) spec.features = parse_integer<std::int64_t>(parsed, "--features", command);
  if (parsed.has("--classes")) spec.classes = parse_integer<std::int64_t>(parsed, "--classes", command);
  if (parsed.has("--outputs")) spec.outputs = parse_integer<std::int64_t>(parsed, "--outputs", command);
  if (is_spatial(kind))
    set_spatial_extent(
        spec, parsed.has("--size") ? parse_integer<std::int64_t>(parsed, "--size", command) : spec.size,
        parsed.has("--channels") ? parse_integer<std::int64_t>(parsed, "--channels", command) : spec.channels);
  if (parsed.has("--noise")) spec.noise = parse_number(parsed, "--noise", command);
  if (parsed.has("--seed")) spec.seed = parse_integer<std::uint64_t>(parsed, "--seed", command);
  try {
    validate_synthetic_spec(spec);
  } catch (const InputError& error) {
    throw InputError(command + ": " + error.what(), help_hint);
  }
  const std::string output = parsed.values.at("--output");

  if (mpi.is_root()) {
    write_then_rename(command, "--output", output, parsed.has("--force"),
                      [&](const std::string& partial) { write_synthetic_dataset(spec, partial); });

    std::ostringstream line;
    std::string shape;
    for (auto extent : synthetic_sample_shape(spec)) shape += ", " + std::to_string(extent);
    line << "wrote " << output << ": " << spec.samples << " samples of " << kind_name << " (" << spec.features
         << " features, ";
    if (is_classification(kind)) {
      line << spec.classes << " classes";
    } else {
      line << spec.outputs << " outputs";
    }
    line << ", noise " << spec.noise << ", seed " << spec.seed << "): /features (" << spec.samples << shape
         << ") float32, ";
    if (is_classification(kind)) {
      line << "/labels (" << spec.samples << ") int32";
    } else {
      line << "/targets (" << spec.samples << ", " << spec.outputs << ") float32";
    }
    std::printf("%s\n", line.str().c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

// --- data inspect ---

// Range, distinct values and counts of a label dataset, read block by block.
struct LabelSummary {
  std::int64_t values = 0;
  double minimum = 0, maximum = 0;
  bool whole_numbers = true, finite = true;
  std::unordered_map<std::int64_t, std::int64_t> counts;  // label -> occurrences, while few enough to track
  bool too_many_distinct = false;
};

LabelSummary summarise_labels(Hdf5Dataset& labels) {
  constexpr std::int64_t block_values = 1 << 20;  // 4 MiB per read, whatever the file size
  constexpr std::size_t tracked_at_most = 1 << 20;
  const std::int64_t width = std::max<std::int64_t>(labels.sample_size(), 1);
  const std::int64_t block_rows = std::max<std::int64_t>(block_values / width, 1);
  std::vector<float> as_float;           // (block_rows, width): float-typed labels
  std::vector<std::int32_t> as_integer;  // (block_rows, width): integer-typed labels
  LabelSummary summary;
  auto add = [&](double value) {
    if (!std::isfinite(value)) {
      summary.finite = false;
      return;
    }
    if (summary.values == 0 || value < summary.minimum) summary.minimum = value;
    if (summary.values == 0 || value > summary.maximum) summary.maximum = value;
    ++summary.values;
    if (value != std::floor(value)) summary.whole_numbers = false;
    if (!summary.too_many_distinct && summary.whole_numbers) {
      ++summary.counts[static_cast<std::int64_t>(value)];
      if (summary.counts.size() > tracked_at_most) summary.too_many_distinct = true;
    }
  };
  for (std::int64_t first = 0; first < labels.samples(); first += block_rows) {
    const std::int64_t rows = std::min(block_rows, labels.samples() - first);
    const std::size_t count = static_cast<std::size_t>(rows * labels.sample_size());
    if (labels.stores_integers()) {
      as_integer.resize(count);
      labels.read_range(first, rows, as_integer.data());
      for (std::int32_t value : as_integer) add(value);
    } else {
      as_float.resize(count);
      labels.read_range(first, rows, as_float.data());
      for (float value : as_float) add(value);
    }
  }
  return summary;
}

std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

void print_label_summary(const std::string& file) {
  Hdf5Dataset labels(file, "/labels");
  const LabelSummary summary = summarise_labels(labels);
  std::printf("labels (/labels, %s):", labels.type_name().c_str());
  if (summary.values == 0) {
    std::printf(" %s\n", summary.finite ? "empty" : "no finite values");
    return;
  }
  std::printf(" range [%s, %s]", number_text(summary.minimum).c_str(), number_text(summary.maximum).c_str());
  if (!summary.whole_numbers) {
    std::printf(", not all whole numbers (class labels must be)");
  } else if (summary.too_many_distinct) {
    std::printf(", more than %zu distinct values", summary.counts.size() - 1);
  } else {
    std::printf(", %zu distinct", summary.counts.size());
    constexpr std::size_t counts_shown_at_most = 20;
    if (summary.counts.size() <= counts_shown_at_most) {
      std::vector<std::pair<std::int64_t, std::int64_t>> sorted(summary.counts.begin(), summary.counts.end());
      std::sort(sorted.begin(), sorted.end());
      std::printf("; counts");
      for (std::size_t i = 0; i < sorted.size(); ++i)
        std::printf("%s %lld: %lld", i > 0 ? "," : "", static_cast<long long>(sorted[i].first),
                    static_cast<long long>(sorted[i].second));
    }
  }
  if (!summary.finite) std::printf("; NaN or Inf present");
  std::printf("\n");
}

// min/max/mean/std per channel of one dataset, in a table.
void print_channel_statistics(const std::string& file, const std::string& path, bool all_channels) {
  std::unique_ptr<Hdf5Dataset> dataset;
  try {
    dataset = std::make_unique<Hdf5Dataset>(file, path);
  } catch (const InputError& error) {  // strings, compounds, a scalar: nothing to summarise
    std::printf("channels (%s): not summarised (%s)\n", path.c_str(), error.what());
    return;
  }
  const std::vector<ChannelStatistics> channels = channel_statistics(*dataset);
  const auto& shape = dataset->shape();
  const std::int64_t per_sample =
      channels.empty() ? 0 : dataset->sample_size() / static_cast<std::int64_t>(channels.size());
  std::printf("channels (%s, %s): %zu, %lld value%s per sample each\n", path.c_str(), dataset->type_name().c_str(),
              channels.size(), static_cast<long long>(per_sample), per_sample == 1 ? "" : "s");
  if (shape.empty() || shape[0] == 0) return;
  constexpr std::size_t shown_by_default = 32;
  const std::size_t shown = all_channels ? channels.size() : std::min(channels.size(), shown_by_default);
  std::printf("  %7s  %14s  %14s  %14s  %14s\n", "channel", "min", "max", "mean", "std");
  std::int64_t non_finite = 0;
  for (std::size_t c = 0; c < channels.size(); ++c) {
    const ChannelStatistics& statistics = channels[c];
    non_finite += statistics.non_finite;
    if (c >= shown) continue;
    if (statistics.count == 0) {
      std::printf("  %7zu  %14s\n", c, "no finite values");
      continue;
    }
    std::printf("  %7zu  %14.7g  %14.7g  %14.7g  %14.7g%s\n", c, statistics.minimum, statistics.maximum,
                statistics.mean, statistics.standard_deviation(),
                statistics.non_finite > 0 ? ("  (" + std::to_string(statistics.non_finite) + " NaN/Inf)").c_str() : "");
  }
  if (shown < channels.size())
    std::printf("  ... %zu more channels (--all-channels prints them)\n", channels.size() - shown);
  if (non_finite > 0)
    std::printf("warning: %lld NaN or Inf values in %s\n", static_cast<long long>(non_finite), path.c_str());
}

struct DatasetRow {
  std::string path, shape, type, storage;
  std::vector<std::int64_t> dims;
};

int inspect_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data inspect";
  const ParsedArguments parsed = parse_arguments(args, {{"--features", true}, {"--all-channels", false}}, command);
  if (parsed.help) {
    if (mpi.is_root()) std::fputs(inspect_usage, stdout);
    return 0;
  }
  const std::string help_hint = "see '" + command + " --help'";
  HPCTRAIN_VERIFY(!parsed.positionals.empty(), InputError, command << ": no file given", help_hint);
  HPCTRAIN_VERIFY(parsed.positionals.size() == 1, InputError,
                  command << ": unexpected argument '" << parsed.positionals[1] << "' (one file at a time)", help_hint);
  const std::string file = parsed.positionals[0];

  if (mpi.is_root()) {
    const auto lock = lock_hdf5();
    const H5Handle handle = open_file_read_only(file, "data file");
    std::error_code size_error;
    const std::uintmax_t bytes = std::filesystem::file_size(file, size_error);
    std::printf("file: %s (%s)\n", file.c_str(), size_error ? "size unknown" : human_size(bytes).c_str());

    std::vector<DatasetRow> rows;
    for (const std::string& path : list_datasets(handle.get())) {
      const H5Handle dataset = open_dataset(handle.get(), path);
      const H5Handle space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset.get())));
      const H5Handle type(HPCTRAIN_H5_CHECK(H5Dget_type(dataset.get())));
      DatasetRow row;
      row.path = path;
      row.dims = dataspace_shape(space.get());
      row.shape = shape_text(row.dims);
      row.type = type_name(type.get());
      row.storage = storage_description(dataset.get());
      rows.push_back(std::move(row));
    }
    std::size_t path_width = 0, shape_width = 0, type_width = 0;
    for (const DatasetRow& row : rows) {
      path_width = std::max(path_width, row.path.size());
      shape_width = std::max(shape_width, row.shape.size());
      type_width = std::max(type_width, row.type.size());
    }
    std::printf("datasets:%s\n", rows.empty() ? " none" : "");
    for (const DatasetRow& row : rows) {
      std::printf("  %-*s  %-*s  %-*s  %s\n", static_cast<int>(path_width), row.path.c_str(),
                  static_cast<int>(shape_width), row.shape.c_str(), static_cast<int>(type_width), row.type.c_str(),
                  row.storage.c_str());
    }

    // Samples: the first dimension of /features, or of every dataset when there is no /features but they agree.
    const auto features =
        std::find_if(rows.begin(), rows.end(), [](const DatasetRow& r) { return r.path == "/features"; });
    std::optional<std::int64_t> samples;
    if (features != rows.end() && !features->dims.empty()) {
      samples = features->dims[0];
    } else if (!rows.empty() && std::all_of(rows.begin(), rows.end(), [&](const DatasetRow& r) {
                 return !r.dims.empty() && !rows[0].dims.empty() && r.dims[0] == rows[0].dims[0];
               })) {
      samples = rows[0].dims[0];
    }
    if (samples) {
      std::printf("samples: %lld\n", static_cast<long long>(*samples));
      for (const DatasetRow& row : rows) {
        if ((row.path == "/labels" || row.path == "/targets") && !row.dims.empty() && row.dims[0] != *samples)
          std::printf("warning: %s has %lld rows but /features has %lld\n", row.path.c_str(),
                      static_cast<long long>(row.dims[0]), static_cast<long long>(*samples));
      }
    } else if (!rows.empty()) {
      std::printf("samples: unknown (no /features, and the datasets differ in their first dimension)\n");
    }

    const auto labels = std::find_if(rows.begin(), rows.end(), [](const DatasetRow& r) { return r.path == "/labels"; });
    if (labels != rows.end()) {
      if (labels->dims.empty() || labels->type.starts_with("string") || labels->type == "compound" ||
          labels->type == "enum" || labels->type == "array" || labels->type == "opaque") {
        std::printf("labels (/labels, %s): not numbers with one row per sample, cannot be used as class labels\n",
                    labels->type.c_str());
      } else {
        print_label_summary(file);
      }
    }

    const std::string features_path = parsed.has("--features") ? parsed.values.at("--features") : "/features";
    const auto summarised = std::find_if(rows.begin(), rows.end(), [&](const DatasetRow& r) {
      return r.path == features_path || r.path == "/" + features_path;
    });
    if (summarised != rows.end()) {
      print_channel_statistics(file, summarised->path, parsed.has("--all-channels"));
    } else if (parsed.has("--features")) {
      throw InputError(command + ": '" + file + "' has no dataset '" + features_path + "'",
                       "the datasets are listed above");
    }

    const std::vector<std::string> attributes = attribute_names(handle.get());
    std::printf("attributes:%s\n", attributes.empty() ? " none" : "");
    for (const std::string& name : attributes)
      std::printf("  %s = %s\n", name.c_str(), attribute_as_text(handle.get(), name).c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

// --- data convert ---

int convert_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data convert";
  const ParsedArguments parsed = parse_arguments(args,
                                                 {{"--features", true},
                                                  {"--labels", true},
                                                  {"--targets", true},
                                                  {"--csv", true},
                                                  {"--label-column", true},
                                                  {"--target-column", true},
                                                  {"--header", false},
                                                  {"--output", true},
                                                  {"--compress", false},
                                                  {"--force", false}},
                                                 command);
  if (parsed.help) {
    if (mpi.is_root()) std::fputs(convert_usage, stdout);
    return 0;
  }
  const std::string help_hint = "see '" + command + " --help'";
  HPCTRAIN_VERIFY(parsed.positionals.empty(), InputError,
                  command << ": unexpected argument '" << parsed.positionals[0] << "'", help_hint);
  HPCTRAIN_VERIFY(parsed.has("--output"), InputError, command << ": --output FILE.h5 is required", help_hint);
  const bool csv = parsed.has("--csv");
  if (csv) {
    for (const char* option : {"--features", "--labels", "--targets"})
      HPCTRAIN_VERIFY(!parsed.has(option), InputError, command << ": " << option << " is for .npy input, not --csv",
                      help_hint);
    HPCTRAIN_VERIFY(parsed.has("--label-column") != parsed.has("--target-column"), InputError,
                    command << ": --csv needs exactly one of --label-column and --target-column", help_hint);
  } else {
    HPCTRAIN_VERIFY(parsed.has("--features"), InputError,
                    command << ": give --features X.npy with --labels or --targets, or --csv FILE.csv", help_hint);
    HPCTRAIN_VERIFY(parsed.has("--labels") != parsed.has("--targets"), InputError,
                    command << ": give exactly one of --labels Y.npy and --targets T.npy", help_hint);
    for (const char* option : {"--label-column", "--target-column", "--header"})
      HPCTRAIN_VERIFY(!parsed.has(option), InputError, command << ": " << option << " is for --csv input", help_hint);
  }
  const std::string output = parsed.values.at("--output");
  const bool compress = parsed.has("--compress");
  if (mpi.is_root()) {
    std::string summary;
    write_then_rename(command, "--output", output, parsed.has("--force"), [&](const std::string& partial) {
      summary = with_command_context(command, [&] {
        if (csv) {
          CsvConversion conversion;
          conversion.csv = parsed.values.at("--csv");
          conversion.targets = parsed.has("--target-column");
          conversion.label_column = parsed.values.at(conversion.targets ? "--target-column" : "--label-column");
          conversion.header = parsed.has("--header");
          conversion.compress = compress;
          return convert_csv(conversion, partial);
        }
        NpyConversion conversion;
        conversion.features = parsed.values.at("--features");
        conversion.answers_are_labels = parsed.has("--labels");
        conversion.answers = parsed.values.at(conversion.answers_are_labels ? "--labels" : "--targets");
        conversion.compress = compress;
        return convert_npy(conversion, partial);
      });
    });
    // The summary names the temporary file: name the real one.
    const std::string partial = output + ".partial";
    if (const auto at = summary.find(partial); at != std::string::npos) summary.replace(at, partial.size(), output);
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

// --- data split ---

int split_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data split";
  const ParsedArguments parsed = parse_arguments(args,
                                                 {{"--validation-fraction", true},
                                                  {"--seed", true},
                                                  {"--train-output", true},
                                                  {"--validation-output", true},
                                                  {"--shuffle", false},
                                                  {"--compress", false},
                                                  {"--force", false}},
                                                 command);
  if (parsed.help) {
    if (mpi.is_root()) std::fputs(split_usage, stdout);
    return 0;
  }
  const std::string help_hint = "see '" + command + " --help'";
  HPCTRAIN_VERIFY(parsed.positionals.size() == 1, InputError,
                  command << ": " << (parsed.positionals.empty() ? "no input file given" : "one input file only"),
                  help_hint);
  for (const char* option : {"--validation-fraction", "--train-output", "--validation-output"})
    HPCTRAIN_VERIFY(parsed.has(option), InputError, command << ": " << option << " is required", help_hint);
  SplitRequest request;
  request.input = parsed.positionals[0];
  request.validation_fraction = parse_number(parsed, "--validation-fraction", command);
  if (parsed.has("--seed")) request.seed = parse_integer<std::uint64_t>(parsed, "--seed", command);
  request.shuffle = parsed.has("--shuffle");
  request.compress = parsed.has("--compress");
  const std::string train_output = parsed.values.at("--train-output");
  const std::string validation_output = parsed.values.at("--validation-output");
  HPCTRAIN_VERIFY(
      train_output != validation_output && train_output != request.input && validation_output != request.input,
      InputError, command << ": the input and the two outputs must be three different files", help_hint);
  if (mpi.is_root()) {
    std::string summary;
    // Both outputs are written to temporary names; the second rename happens only when both are complete.
    write_then_rename(command, "--train-output", train_output, parsed.has("--force"), [&](const std::string& train) {
      write_then_rename(
          command, "--validation-output", validation_output, parsed.has("--force"), [&](const std::string& validation) {
            summary = with_command_context(command, [&] { return split_dataset(request, train, validation); });
          });
    });
    for (const std::string& name : {train_output, validation_output}) {
      const std::string partial = name + ".partial";
      if (const auto at = summary.find(partial); at != std::string::npos) summary.replace(at, partial.size(), name);
    }
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

// --- data plan ---

TaskKind task_of(const RunConfig& config) { return task_of(config.model.loss); }

// data.batch_size split among `ranks`, with the trainer's message when it does not divide.
std::int64_t local_batch_of(const RunConfig& config, int ranks) {
  const std::int64_t batch = config.data.batch_size;
  HPCTRAIN_VERIFY(batch % ranks == 0, InputError,
                  config.where("data.batch_size")
                      << ": data.batch_size = " << batch << " is not divisible by the " << ranks << " ranks",
                  "data.batch_size is the global batch; pick a multiple of the rank count");
  return batch / ranks;
}

int plan_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data plan";
  const ParsedArguments parsed =
      parse_arguments(args, {{"--ranks", true}, {"--epoch", true}, {"--steps", true}, {"--set", true, true}}, command);
  if (parsed.help) {
    if (mpi.is_root()) std::fputs(plan_usage, stdout);
    return 0;
  }
  const std::string help_hint = "see '" + command + " --help'";
  HPCTRAIN_VERIFY(parsed.positionals.size() == 1, InputError,
                  command << ": " << (parsed.positionals.empty() ? "no deck given" : "one deck only"), help_hint);
  HPCTRAIN_VERIFY(parsed.has("--ranks"), InputError, command << ": --ranks R is required", help_hint);
  const auto ranks = parse_integer<std::int64_t>(parsed, "--ranks", command);
  HPCTRAIN_VERIFY(ranks >= 1 && ranks <= (1 << 24), InputError, command << ": --ranks must be at least 1", help_hint);
  const std::int64_t epoch = parsed.has("--epoch") ? parse_integer<std::int64_t>(parsed, "--epoch", command) : 0;
  HPCTRAIN_VERIFY(epoch >= 0, InputError, command << ": --epoch must be >= 0", help_hint);
  const std::int64_t max_steps =
      parsed.has("--steps") ? parse_integer<std::int64_t>(parsed, "--steps", command) : INT64_MAX;
  const auto overrides = parsed.repeated.contains("--set") ? parsed.repeated.at("--set") : std::vector<std::string>{};
  const RunConfig config = load_run_config(parsed.positionals[0], overrides);

  if (mpi.is_root()) {
    const TrainingData data(config, "data.train", config.data.train, task_of(config));
    const int rank_count = static_cast<int>(ranks);
    const std::int64_t local_batch = local_batch_of(config, rank_count);
    const ShuffleMode mode = config.data.shuffle;
    std::vector<std::unique_ptr<Sampler>> samplers;
    std::vector<std::vector<std::int64_t>> orders;
    for (int rank = 0; rank < rank_count; ++rank) {
      samplers.push_back(make_sampler(mode, data.samples(), rank_count, rank, config.run.seed, config.data.drop_last));
      orders.push_back(samplers.back()->indices(epoch));
    }
    const std::int64_t per_rank = samplers.front()->samples_per_rank();
    const std::int64_t steps = steps_per_epoch(per_rank, local_batch, config.data.drop_last);
    const std::int64_t visited = per_rank * ranks;
    std::printf("# hpctrain data plan: %s, epoch %lld\n", parsed.positionals[0].c_str(), static_cast<long long>(epoch));
    std::printf(
        "# data.train: %s: %lld samples; %lld ranks; global batch %lld = %lld x %lld; data.shuffle = %s; "
        "data.drop_last = %s; run.seed = %llu\n",
        data.file().c_str(), static_cast<long long>(data.samples()), static_cast<long long>(ranks),
        static_cast<long long>(config.data.batch_size), static_cast<long long>(ranks),
        static_cast<long long>(local_batch), std::string(word_of(mode)).c_str(),
        config.data.drop_last ? "true" : "false", static_cast<unsigned long long>(config.run.seed));
    std::printf("# %lld steps per epoch; %lld samples per rank", static_cast<long long>(steps),
                static_cast<long long>(per_rank));
    if (visited > data.samples()) {
      std::printf(" (%lld samples read twice as padding)", static_cast<long long>(visited - data.samples()));
    } else if (visited < data.samples()) {
      std::printf(" (%lld samples dropped this epoch)", static_cast<long long>(data.samples() - visited));
    }
    std::printf("\n");
    if (mode == ShuffleMode::local) {
      std::printf("# local shuffle: each rank reads only its slice:");
      for (int rank = 0; rank < rank_count; ++rank) {
        const auto [first, end] = rank_slice(data.samples(), rank_count, rank);
        std::printf(" rank %d [%lld, %lld)", rank, static_cast<long long>(first), static_cast<long long>(end));
      }
      std::printf("\n");
    }
    std::printf("# each line: step, rank, then the global sample indices that rank reads at that step, in order\n");
    std::string line;
    for (std::int64_t step = 0; step < std::min(steps, max_steps); ++step) {
      for (int rank = 0; rank < rank_count; ++rank) {
        const auto& order = orders[static_cast<std::size_t>(rank)];
        const std::int64_t first = step * local_batch;
        const std::int64_t end = std::min<std::int64_t>(first + local_batch, static_cast<std::int64_t>(order.size()));
        line = "step ";
        line += std::to_string(step);
        line += " rank ";
        line += std::to_string(rank);
        line += ':';
        for (std::int64_t i = first; i < end; ++i) {
          line += ' ';
          line += std::to_string(order[static_cast<std::size_t>(i)]);
        }
        std::puts(line.c_str());
      }
    }
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

// --- data bench ---

int bench_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data bench";
  const ParsedArguments parsed = parse_arguments(args, {{"--steps", true}, {"--set", true, true}}, command);
  if (parsed.help) {
    if (mpi.is_root()) std::fputs(bench_usage, stdout);
    return 0;
  }
  const std::string help_hint = "see '" + command + " --help'";
  HPCTRAIN_VERIFY(parsed.positionals.size() == 1, InputError,
                  command << ": " << (parsed.positionals.empty() ? "no deck given" : "one deck only"), help_hint);
  const auto overrides = parsed.repeated.contains("--set") ? parsed.repeated.at("--set") : std::vector<std::string>{};
  const RunConfig config = load_run_config(parsed.positionals[0], overrides);
  TrainingData data(config, "data.train", config.data.train, task_of(config));
  const std::int64_t local_batch = local_batch_of(config, mpi.size());

  const double staging_start = MPI_Wtime();
  BatchLoader loader(data, config.data, mpi, local_batch, config.run.seed);
  const double staging = MPI_Wtime() - staging_start;
  const std::int64_t steps =
      parsed.has("--steps") ? parse_integer<std::int64_t>(parsed, "--steps", command) : loader.steps_per_epoch();
  HPCTRAIN_VERIFY(steps >= 1, InputError, command << ": --steps must be at least 1", help_hint);
  const std::int64_t row_bytes = data.feature_width() * static_cast<std::int64_t>(sizeof(float)) +
                                 data.target_width() * static_cast<std::int64_t>(sizeof(float));
  std::int64_t rows = 0;
  const double start = MPI_Wtime();
  for (std::int64_t step = 0; step < steps; ++step) rows += loader.next().rows;
  const double seconds = MPI_Wtime() - start;

  // Rank 0 prints every rank's figures: (staging s, staged bytes, seconds, bytes).
  constexpr int figures_per_rank = 4;
  const double mine[figures_per_rank] = {staging, static_cast<double>(data.rows_in_memory() * row_bytes), seconds,
                                         static_cast<double>(rows * row_bytes)};
  std::vector<double> all(static_cast<std::size_t>(figures_per_rank * mpi.size()));
  HPCTRAIN_MPI_CHECK(
      MPI_Gather(mine, figures_per_rank, MPI_DOUBLE, all.data(), figures_per_rank, MPI_DOUBLE, 0, mpi.world()));
  if (mpi.is_root()) {
    std::printf(
        "# hpctrain data bench: %s: %s, %lld samples of %lld bytes (float32), %d ranks x %lld steps of %lld; "
        "data.shuffle = %s, data.prefetch = %lld, data.in_memory = %s\n",
        parsed.positionals[0].c_str(), data.file().c_str(), static_cast<long long>(data.samples()),
        static_cast<long long>(row_bytes), mpi.size(), static_cast<long long>(steps),
        static_cast<long long>(local_batch), std::string(word_of(config.data.shuffle)).c_str(),
        static_cast<long long>(config.data.prefetch), config.data.in_memory ? "true" : "false");
    std::vector<double> rates, staging_rates;
    for (int rank = 0; rank < mpi.size(); ++rank) {
      const double* figures = all.data() + figures_per_rank * rank;
      const double rate = figures[3] / std::max(figures[2], 1e-12) / 1e6;
      rates.push_back(rate);
      std::printf("rank %d: staging %.1f MB in %.3f s", rank, figures[1] / 1e6, figures[0]);
      if (figures[1] > 0) {
        staging_rates.push_back(figures[1] / std::max(figures[0], 1e-12) / 1e6);
        std::printf(" (%.1f MB/s)", staging_rates.back());
      }
      std::printf(", then read %.1f MB of batches in %.3f s: %.1f MB/s\n", figures[3] / 1e6, figures[2], rate);
    }
    // The median of R values: the middle one, or the mean of the middle two.
    auto median = [](std::vector<double> values) {
      std::sort(values.begin(), values.end());
      const std::size_t middle = values.size() / 2;
      return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
    };
    if (!staging_rates.empty()) std::printf("median per-rank staging throughput: %.1f MB/s\n", median(staging_rates));
    std::printf("median per-rank read throughput: %.1f MB/s\n", median(rates));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int data_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string hint =
      "the sub-commands are generate, inspect, convert, split, plan and bench; see 'hpctrain data --help'";
  HPCTRAIN_VERIFY(!args.empty(), InputError, "hpctrain data: no sub-command given", hint);
  const std::string& sub_command = args[0];
  if (sub_command == "--help" || sub_command == "-h" || sub_command == "help") {
    if (mpi.is_root()) std::fputs(data_usage, stdout);
    return 0;
  }
  const Arguments rest(args.begin() + 1, args.end());
  if (sub_command == "generate") return generate_command(rest, mpi);
  if (sub_command == "inspect") return inspect_command(rest, mpi);
  if (sub_command == "convert") return convert_command(rest, mpi);
  if (sub_command == "split") return split_command(rest, mpi);
  if (sub_command == "plan") return plan_command(rest, mpi);
  if (sub_command == "bench") return bench_command(rest, mpi);
  throw InputError("hpctrain data: unknown sub-command '" + sub_command + "'", hint);
}

}  // namespace hpctrain
