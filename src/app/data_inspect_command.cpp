// `hpctrain data inspect`: describe a data file (datasets, samples, labels, per-channel statistics, attributes).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include "data_tools.hpp"
#include "hpctrain/app/command_line.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/data/channel_statistics.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/data/normalization.hpp"
#include "hpctrain/data/tokens.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace {

const char* const inspect_usage =
    "usage: hpctrain data inspect FILE.h5 [--features PATH] [--all-channels] [--stats-out STATS.h5 [--force]]\n"
    "                             [--sequence-length T]\n"
    "\n"
    "Describe an HDF5 data file: every dataset (shape, stored type, chunking and compression), the number of\n"
    "samples, the range and number of distinct labels in /labels, min/max/mean/std of every feature channel,\n"
    "min/max/mean/std of every column of /targets (regression targets), and the attributes of the root. The file\n"
    "is read in bounded blocks, so any size is fine.\n"
    "\n"
    "options:\n"
    "  --features PATH   the dataset to summarise per channel (default /features)\n"
    "  --all-channels    print every channel (default: the first 32)\n"
    "  --stats-out FILE  write the per-channel mean and std of the features (float64) to FILE for the deck's\n"
    "                    data.normalize = \"FILE\" (x -> (x - mean) / std); a constant channel gets std 1\n"
    "  --force           overwrite an existing --stats-out file\n"
    "  --sequence-length T  token files: count the windows of T + 1 tokens (default: the file's attribute)\n"
    "\n"
    "A channel is the second dimension: (N, F) has F channels, (N, C, H, W) has C channels of H x W values.\n"
    "std is the population standard deviation (numpy.std). NaN and Inf are counted apart and left out.\n"
    "A token file (/tokens, for language models) gets the token count, the windows (samples) for T, the vocabulary,\n"
    "the ids used, the most frequent ids (bytes, for byte-level text) and the unigram entropy in bits per token: the\n"
    "loss of a model that knows only the token frequencies, the baseline a language model must beat.\n";

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

// min/max/mean/std per channel of one dataset, in a table; returns them (empty when the dataset is not numbers).
// `what` names the rows: "channels" for features, "targets" for regression targets.
std::vector<ChannelStatistics> print_channel_statistics(const std::string& file, const std::string& path,
                                                        bool all_channels, const char* what = "channels") {
  std::unique_ptr<Hdf5Dataset> dataset;
  try {
    dataset = std::make_unique<Hdf5Dataset>(file, path);
  } catch (const InputError& error) {  // strings, compounds, a scalar: nothing to summarise
    std::printf("%s (%s): not summarised (%s)\n", what, path.c_str(), error.what());
    return {};
  }
  const std::vector<ChannelStatistics> channels = channel_statistics(*dataset);
  const auto& shape = dataset->shape();
  const std::int64_t per_sample =
      channels.empty() ? 0 : dataset->sample_size() / static_cast<std::int64_t>(channels.size());
  std::printf("%s (%s, %s): %zu, %lld value%s per sample each\n", what, path.c_str(), dataset->type_name().c_str(),
              channels.size(), static_cast<long long>(per_sample), per_sample == 1 ? "" : "s");
  if (shape.empty() || shape[0] == 0) return channels;
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
  return channels;
}

// A byte-level token for display: 'e', ' ', '\n', or \xNN.
std::string byte_text(std::int64_t id) {
  if (id == '\n') return "'\\n'";
  if (id == '\t') return "'\\t'";
  char text[8];
  if (id >= 32 && id < 127) {
    std::snprintf(text, sizeof text, "'%c'", static_cast<char>(id));
  } else {
    std::snprintf(text, sizeof text, "\\x%02llx", static_cast<unsigned long long>(id));
  }
  return text;
}

void print_token_summary(const std::string& file, const CommandLine& parsed) {
  const TokenFileInfo info = read_token_file_info(file);
  std::string tokenizer;
  {
    const auto lock = lock_hdf5();
    const H5Handle handle = open_file_read_only(file, "data file");
    if (attribute_exists(handle.get(), "tokenizer")) tokenizer = read_string_attribute(handle.get(), "tokenizer");
  }
  const bool bytes = tokenizer == "bytes";
  std::printf("tokens (%s, %s): %lld, vocabulary %lld%s\n", tokens_dataset, info.type_name.c_str(),
              static_cast<long long>(info.tokens), static_cast<long long>(info.vocabulary),
              bytes ? " (byte-level text)" : "");
  const std::int64_t length =
      parsed.has("--sequence-length") ? parsed.integer<std::int64_t>("--sequence-length") : info.sequence_length;
  HPCTRAIN_VERIFY(length >= 0, InputError, parsed.command() << ": --sequence-length must be >= 1", parsed.help_hint());
  if (length > 0) {
    std::printf("windows: %lld of %lld tokens at T = %lld (%s)\n",
                static_cast<long long>(token_windows(info.tokens, length)), static_cast<long long>(length + 1),
                static_cast<long long>(length),
                parsed.has("--sequence-length") ? "--sequence-length" : "the file's sequence_length");
  } else {
    std::printf("windows: --sequence-length T counts them (the file has no sequence_length attribute)\n");
  }
  constexpr std::int64_t counted_vocabulary_at_most = std::int64_t{1} << 27;
  if (info.vocabulary > counted_vocabulary_at_most) {
    std::printf("id frequencies: not counted (vocabulary above %lld)\n",
                static_cast<long long>(counted_vocabulary_at_most));
    return;
  }
  const TokenCounts counts = count_tokens(file, info);
  std::printf("ids used: %lld of %lld\n", static_cast<long long>(counts.ids_used()),
              static_cast<long long>(info.vocabulary));
  std::vector<std::int64_t> order(counts.counts.size());
  for (std::size_t id = 0; id < order.size(); ++id) order[id] = static_cast<std::int64_t>(id);
  constexpr std::size_t shown = 10;
  const std::size_t top = std::min(shown, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
                    [&](std::int64_t a, std::int64_t b) {
                      const std::int64_t ca = counts.counts[static_cast<std::size_t>(a)],
                                         cb = counts.counts[static_cast<std::size_t>(b)];
                      return ca != cb ? ca > cb : a < b;
                    });
  std::printf("most frequent %s:", bytes ? "bytes" : "ids");
  for (std::size_t i = 0; i < top && counts.counts[static_cast<std::size_t>(order[i])] > 0; ++i) {
    const std::int64_t id = order[i];
    std::printf(
        "%s %s %.2f%%", i > 0 ? "," : "", bytes ? byte_text(id).c_str() : std::to_string(id).c_str(),
        100.0 * static_cast<double>(counts.counts[static_cast<std::size_t>(id)]) / static_cast<double>(counts.tokens));
  }
  std::printf("\n");
  const double entropy = counts.entropy_bits();
  std::printf(
      "unigram entropy: %.4f bits per token (%.4f nats: the loss of a model that knows only the token "
      "frequencies)\n",
      entropy, entropy * std::log(2.0));
  if (counts.out_of_range > 0)
    std::printf("warning: %lld ids outside [0, %lld) (the first at position %lld); training refuses them\n",
                static_cast<long long>(counts.out_of_range), static_cast<long long>(info.vocabulary),
                static_cast<long long>(counts.first_out_of_range));
}

struct DatasetRow {
  std::string path, shape, type, storage;
  std::vector<std::int64_t> dims;
};

}  // namespace

int data_inspect_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data inspect";
  const CommandLine parsed(args, command,
                           {{"--features", true},
                            {"--all-channels", false},
                            {"--stats-out", true},
                            {"--force", false},
                            {"--sequence-length", true}});
  if (print_help_if_asked(parsed, inspect_usage, mpi)) return 0;
  const std::string help_hint = parsed.help_hint();
  HPCTRAIN_VERIFY(!parsed.positionals().empty(), InputError, command << ": no file given", help_hint);
  HPCTRAIN_VERIFY(parsed.positionals().size() == 1, InputError,
                  command << ": unexpected argument '" << parsed.positionals()[1] << "' (one file at a time)",
                  help_hint);
  const std::string file = parsed.positionals()[0];

  if (mpi.is_root()) {
    const auto lock = lock_hdf5();
    const H5Handle handle = open_file_read_only(file, "data file");
    std::error_code size_error;
    const std::uintmax_t bytes = std::filesystem::file_size(file, size_error);
    std::printf("file: %s (%s)\n", file.c_str(), size_error ? "size unknown" : byte_size_text(bytes).c_str());

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

    if (std::any_of(rows.begin(), rows.end(), [](const DatasetRow& r) { return r.path == tokens_dataset; })) {
      with_command_context(command, [&] { print_token_summary(file, parsed); });
    } else if (parsed.has("--sequence-length")) {
      throw InputError(command + ": --sequence-length is for token files, and '" + file + "' has no " + tokens_dataset,
                       "the datasets are listed above");
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
    if (samples && features == rows.end() && rows.size() == 1 && rows[0].path == tokens_dataset) {
      // a token file: its samples are the windows above
    } else if (samples) {
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

    const std::string features_path = parsed.has("--features") ? parsed.value("--features") : "/features";
    const auto summarised = std::find_if(rows.begin(), rows.end(), [&](const DatasetRow& r) {
      return r.path == features_path || r.path == "/" + features_path;
    });
    std::vector<ChannelStatistics> channels;
    if (summarised != rows.end()) {
      channels = print_channel_statistics(file, summarised->path, parsed.has("--all-channels"));
    } else if (parsed.has("--features") || parsed.has("--stats-out")) {
      throw InputError(command + ": '" + file + "' has no dataset '" + features_path + "'",
                       parsed.has("--features") ? "the datasets are listed above"
                                                : "name the features with --features PATH (the datasets are listed "
                                                  "above)");
    }
    const auto targets =
        std::find_if(rows.begin(), rows.end(), [](const DatasetRow& r) { return r.path == "/targets"; });
    if (targets != rows.end()) print_channel_statistics(file, "/targets", parsed.has("--all-channels"), "targets");

    if (parsed.has("--stats-out")) {
      HPCTRAIN_VERIFY(!channels.empty(), InputError,
                      command << ": '" << summarised->path << "' in '" << file << "' has no numbers to summarise",
                      "--stats-out needs a numeric features dataset");
      const std::string output = parsed.value("--stats-out");
      std::vector<std::size_t> constant;
      write_output_file(parsed, "--stats-out", output, [&](const std::string& temporary) {
        constant = write_normalization_file(temporary, file, summarised->path, channels);
      });
      std::printf("wrote the mean and std of %zu channels of %s to %s (use data.normalize = \"%s\")\n", channels.size(),
                  summarised->path.c_str(), output.c_str(), output.c_str());
      if (!constant.empty())
        std::printf(
            "note: %zu constant channel%s (std 0, e.g. channel %zu) written with std 1: only the mean is "
            "subtracted there\n",
            constant.size(), constant.size() == 1 ? "" : "s", constant.front());
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

}  // namespace hpctrain
