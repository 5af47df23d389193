// `hpctrain data generate KIND ...` writes a synthetic dataset; `hpctrain data inspect FILE.h5` describes a data file.
//
// Every rank parses the command line (so a bad option is reported once, by rank 0, like every error all ranks see);
// only rank 0 touches files and prints, and the other ranks wait for it at a barrier.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "hpctrain/app/commands.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/generate.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace {

const char* const data_usage =
    "usage: hpctrain data <sub-command> ...\n"
    "\n"
    "sub-commands:\n"
    "  generate KIND --samples N --output FILE.h5 [options]   write a synthetic dataset (blobs, spirals, regression)\n"
    "  inspect FILE.h5                                        describe the datasets, labels and attributes of a file\n"
    "\n"
    "Run 'hpctrain data generate --help' or 'hpctrain data inspect --help' for details.\n";

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
    "\n"
    "options:\n"
    "  --samples N       number of samples (required)\n"
    "  --output FILE.h5  file to write (required); written as FILE.h5.partial and renamed when complete\n"
    "  --features F      values per sample (default 2; regression 4)\n"
    "  --classes C       number of classes, blobs and spirals (default 3)\n"
    "  --outputs K       targets per sample, regression (default 1)\n"
    "  --noise X         noise level (default: blobs 1, spirals 0.05, regression 0.1)\n"
    "  --seed S          random seed, 0 <= S < 2^63 (default 0)\n"
    "  --force           replace FILE.h5 if it exists\n"
    "  --help            show this help\n"
    "\n"
    "The file holds /features (N, F) float32 and /labels (N) int32 in [0, C), or /targets (N, K) float32 for\n"
    "regression, with the options recorded as attributes of the root.\n";

const char* const inspect_usage =
    "usage: hpctrain data inspect FILE.h5\n"
    "\n"
    "Describe an HDF5 data file: every dataset (shape, stored type, chunking and compression), the number of\n"
    "samples, the range and number of distinct labels in /labels, and the attributes of the root.\n"
    "The file is read in bounded blocks, so any size is fine.\n";

// --- command-line parsing ---

struct OptionSpec {
  std::string name;  // "--samples"
  bool takes_value;
};

struct ParsedArguments {
  std::vector<std::string> positionals;
  std::map<std::string, std::string> values;  // option -> value ("" for a flag)
  bool help = false;

  [[nodiscard]] bool has(const std::string& option) const { return values.contains(option); }
};

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> previous(b.size() + 1), current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(previous, current);
  }
  return previous[b.size()];
}

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
      std::string hint = help_hint;
      for (const OptionSpec& candidate : options) {
        if (edit_distance(name, candidate.name) <= 2) {
          hint = "did you mean '" + candidate.name + "'? " + help_hint;
          break;
        }
      }
      throw InputError(command + ": unknown option '" + name + "'", hint);
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

// --- data generate ---

int generate_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data generate";
  const ParsedArguments parsed = parse_arguments(args,
                                                 {{"--samples", true},
                                                  {"--features", true},
                                                  {"--classes", true},
                                                  {"--outputs", true},
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
                  "the kinds are blobs, spirals and regression; " + help_hint);
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
                  command << ": --classes applies to blobs and spirals, not regression (which has --outputs)",
                  help_hint);

  SyntheticSpec spec = default_synthetic_spec(kind);
  spec.samples = parse_integer<std::int64_t>(parsed, "--samples", command);
  if (parsed.has("--features")) spec.features = parse_integer<std::int64_t>(parsed, "--features", command);
  if (parsed.has("--classes")) spec.classes = parse_integer<std::int64_t>(parsed, "--classes", command);
  if (parsed.has("--outputs")) spec.outputs = parse_integer<std::int64_t>(parsed, "--outputs", command);
  if (parsed.has("--noise")) spec.noise = parse_number(parsed, "--noise", command);
  if (parsed.has("--seed")) spec.seed = parse_integer<std::uint64_t>(parsed, "--seed", command);
  try {
    validate_synthetic_spec(spec);
  } catch (const InputError& error) {
    throw InputError(command + ": " + error.what(), help_hint);
  }
  const std::string output = parsed.values.at("--output");
  HPCTRAIN_VERIFY(!output.empty(), InputError, command << ": --output is empty", help_hint);

  if (mpi.is_root()) {
    namespace fs = std::filesystem;
    const fs::path output_path(output);
    const fs::path directory = output_path.has_parent_path() ? output_path.parent_path() : fs::path(".");
    HPCTRAIN_VERIFY(fs::is_directory(directory), InputError,
                    command << ": the directory of --output, '" << directory.string() << "', does not exist",
                    "create it first (mkdir -p " + directory.string() + ")");
    HPCTRAIN_VERIFY(!fs::is_directory(output_path), InputError,
                    command << ": --output '" << output << "' is a directory",
                    "name a file, e.g. " + output + "/data.h5");
    HPCTRAIN_VERIFY(!fs::exists(output_path) || parsed.has("--force"), InputError,
                    command << ": '" << output << "' already exists",
                    "pass --force to replace it, or choose another --output");

    // Written under a temporary name and renamed when complete: a crash or a full disk never leaves a half-written file
    // under the name a training deck points at.
    const std::string partial = output + ".partial";
    try {
      write_synthetic_dataset(spec, partial);
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

    std::ostringstream line;
    line << "wrote " << output << ": " << spec.samples << " samples of " << kind_name << " (" << spec.features
         << " features, ";
    if (is_classification(kind)) {
      line << spec.classes << " classes";
    } else {
      line << spec.outputs << " outputs";
    }
    line << ", noise " << spec.noise << ", seed " << spec.seed << "): /features (" << spec.samples << ", "
         << spec.features << ") float32, ";
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

struct DatasetRow {
  std::string path, shape, type, storage;
  std::vector<std::int64_t> dims;
};

int inspect_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data inspect";
  const ParsedArguments parsed = parse_arguments(args, {}, command);
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

    const std::vector<std::string> attributes = attribute_names(handle.get());
    std::printf("attributes:%s\n", attributes.empty() ? " none" : "");
    for (const std::string& name : attributes)
      std::printf("  %s = %s\n", name.c_str(), attribute_as_text(handle.get(), name).c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

}  // namespace

int data_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string hint = "the sub-commands are 'generate' and 'inspect'; see 'hpctrain data --help'";
  HPCTRAIN_VERIFY(!args.empty(), InputError, "hpctrain data: no sub-command given", hint);
  const std::string& sub_command = args[0];
  if (sub_command == "--help" || sub_command == "-h" || sub_command == "help") {
    if (mpi.is_root()) std::fputs(data_usage, stdout);
    return 0;
  }
  const Arguments rest(args.begin() + 1, args.end());
  if (sub_command == "generate") return generate_command(rest, mpi);
  if (sub_command == "inspect") return inspect_command(rest, mpi);
  throw InputError("hpctrain data: unknown sub-command '" + sub_command + "'", hint);
}

}  // namespace hpctrain
