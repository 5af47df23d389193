// A data split as one rank sees it: several files read as one, start-up checks, batch reads (from the files or from
// memory), and the feature transforms.
#include "hpctrain/data/training_data.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/copy_bytes.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/data/data_files.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/data/normalization.hpp"
#include "hpctrain/data/sampler.hpp"
#include "hpctrain/data/tokens.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace {
// Values read per block during validation: bounded memory whatever the file size.
constexpr std::int64_t validation_block_values = 1 << 20;
constexpr std::int64_t no_sample = std::numeric_limits<std::int64_t>::max();
}  // namespace

// --- FeatureTransform ---

FeatureTransform FeatureTransform::from(const DataSection& section) {
  FeatureTransform transform;
  transform.log1p = section.log1p;
  transform.scale = static_cast<float>(section.scale);
  transform.shift = static_cast<float>(section.shift);
  for (std::size_t c = 0; c < section.mean.size(); ++c) {
    transform.mean.push_back(static_cast<float>(section.mean[c]));
    transform.std.push_back(static_cast<float>(section.std[c]));
  }
  return transform;
}

void FeatureTransform::apply(float* values, std::int64_t count) const {
  if (is_identity()) return;
  const float a = scale, b = shift;
  if (log1p) {
    for (std::int64_t i = 0; i < count; ++i) values[i] = std::log1p(values[i]) * a + b;
  } else if (a != 1.0f || b != 0.0f) {
    for (std::int64_t i = 0; i < count; ++i) values[i] = values[i] * a + b;
  }
  if (mean.empty()) return;
  HPCTRAIN_ASSERT(row > 0 && count % row == 0, "FeatureTransform::apply: the data's shape was not set");
  for (std::int64_t first = 0; first < count; first += row)
    for (std::size_t c = 0; c < mean.size(); ++c) {
      float* channel = values + first + static_cast<std::int64_t>(c) * inner;
      for (std::int64_t i = 0; i < inner; ++i) channel[i] = (channel[i] - mean[c]) / std[c];
    }
}

std::string FeatureTransform::description() const {
  std::ostringstream text;
  const char* separator = "";
  if (log1p) {
    text << "data.log1p";
    separator = ", then ";
  }
  if (scale != 1.0f) {
    text << separator << "data.scale = " << scale;
    separator = ", then ";
  }
  if (shift != 0.0f) {
    text << separator << "data.shift = " << shift;
    separator = ", then ";
  }
  if (!mean.empty()) text << separator << "standardisation (data.mean, data.std)";
  return text.str();
}

std::string channels_last_hint(const TrainingData& data, const std::string& features_path) {
  const std::vector<std::int64_t>& shape = data.sample_shape();
  if (shape.size() != 3 && shape.size() != 4) return "";
  const std::int64_t channels = shape.front(), last = shape.back();
  constexpr std::int64_t image_channels[] = {1, 3, 4};  // grey, RGB, RGBA
  if (std::find(std::begin(image_channels), std::end(image_channels), last) == std::end(image_channels) ||
      channels < 8 || channels <= last)
    return "";
  std::vector<std::int64_t> moved(shape.begin(), shape.end() - 1);
  moved.insert(moved.begin(), last);
  return "warning: the features '" + features_path + "' in " + data.file() + " have samples of shape " +
         shape_text(shape) + ", read as " + std::to_string(channels) + " channels of " +
         shape_text(std::vector<std::int64_t>(shape.begin() + 1, shape.end())) + "; they look stored channels-last (" +
         std::to_string(last) + " channels at the end). hpctrain reads (N, C, H, W) / (N, C, D, H, W): store them as " +
         shape_text(moved) + " per sample (numpy: np.moveaxis(x, -1, 1)), or ignore this if the layout is intended";
}

// --- TrainingData ---

struct TrainingData::Part {
  std::string file;
  std::unique_ptr<Hdf5Dataset> features, answers;

  // A failing HDF5 read inside a file that opened fine means damaged data: say which file, as an input error of this
  // rank (other ranks may read other parts of it).
  template <class Read>
  void guarded(const std::string& context, const std::string& dataset, Read&& read) const {
    try {
      read();
    } catch (const LibraryError& error) {
      throw InputError(context + ": reading '" + dataset + "' from '" + file + "' failed: " + error.what(),
                       "the file may be damaged (a truncated copy, a bad disk block); 'h5dump -H " + file +
                           "' checks its structure, regenerating or re-copying it fixes it",
                       ErrorScope::this_rank);
    }
  }
};

TrainingData::TrainingData(const RunConfig& config, const std::string& split_key, const std::string& file,
                           TaskKind task, DataContents contents)
    : TrainingData(config, split_key, std::vector<std::string>{file}, task, contents) {}

TrainingData::TrainingData(const RunConfig& config, const std::string& split_key,
                           const std::vector<std::string>& patterns, TaskKind task, DataContents contents)
    : split_key_(split_key),
      where_(config.where(split_key)),
      task_(task),
      answers_(contents == DataContents::features_and_answers),
      transform_(FeatureTransform::from(config.data)) {
  files_ = expand_data_files(patterns, where_, split_key);
  description_ = describe_files(files_);
  const std::string context = where_ + ": " + split_key;
  bool token_data = false;
  try {
    token_data = !files_.empty() && file_holds_tokens(files_.front());
  } catch (const InputError& error) {
    throw InputError(context + ": " + error.what(), error.hint(), error.scope());
  }
  if (token_data) {
    set_up_tokens(config);
    return;
  }
  const bool classification = task == TaskKind::classification;
  const std::string answers_path = classification ? config.data.labels : config.data.targets;
  const std::string answers_key = classification ? "data.labels" : "data.targets";

  for (const std::string& file : files_) {
    auto part = std::make_unique<Part>();
    part->file = file;
    try {
      part->features = std::make_unique<Hdf5Dataset>(file, config.data.features);
      if (answers_) part->answers = std::make_unique<Hdf5Dataset>(file, answers_path);
    } catch (const InputError& error) {
      throw InputError(context + ": " + error.what(), error.hint(), error.scope());
    }
    const auto& feature_shape = part->features->shape();
    HPCTRAIN_VERIFY(feature_shape.size() >= 2, InputError,
                    context << ": features '" << config.data.features << "' in '" << file << "' have shape "
                            << shape_text(feature_shape) << "; expected (samples, features...)",
                    "store one sample per row: a 2-D (or higher) dataset whose first dimension is the sample");
    const std::int64_t rows = feature_shape[0];
    if (answers_) {
      const auto& answer_shape = part->answers->shape();
      HPCTRAIN_VERIFY(
          answer_shape[0] == rows, InputError,
          context << ": '" << file << "' has " << rows << " samples in '" << config.data.features << "' but "
                  << answer_shape[0] << " in '" << answers_path << "'",
          "features and " + std::string(classification ? "labels" : "targets") + " must have one row per sample");
      HPCTRAIN_VERIFY(!classification || answer_shape.size() == 1 || (answer_shape.size() == 2 && answer_shape[1] == 1),
                      InputError,
                      context << ": labels '" << answers_path << "' in '" << file << "' have shape "
                              << shape_text(answer_shape) << "; cross_entropy needs one integer label per sample",
                      "store labels as a 1-D integer dataset (N), or use model.loss = \"mse\" with " + answers_key);
    }
    const std::vector<std::int64_t> sample_shape(feature_shape.begin() + 1, feature_shape.end());
    if (parts_.empty()) {
      sample_shape_ = sample_shape;
      feature_width_ = part->features->sample_size();
      if (!classification && answers_) target_width_ = part->answers->sample_size();
    } else {
      HPCTRAIN_VERIFY(sample_shape == sample_shape_, InputError,
                      context << ": '" << file << "' holds samples of shape " << shape_text(sample_shape) << " in '"
                              << config.data.features << "', but '" << files_.front() << "' holds "
                              << shape_text(sample_shape_),
                      "every file of one split must have the same per-sample feature shape");
      HPCTRAIN_VERIFY(classification || !answers_ || part->answers->sample_size() == target_width_, InputError,
                      context << ": '" << file << "' has " << part->answers->sample_size() << " target columns in '"
                              << answers_path << "', but '" << files_.front() << "' has " << target_width_,
                      "every file of one split must have the same number of targets per sample");
    }
    part_begins_.push_back(samples_);
    samples_ += rows;
    parts_.push_back(std::move(part));
  }
  part_begins_.push_back(samples_);
  HPCTRAIN_VERIFY(samples_ > 0, InputError, context << ": " << description_ << " holds no samples");
  set_up_standardisation(config);
}

void TrainingData::set_up_tokens(const RunConfig& config) {
  const std::string context = where_ + ": " + split_key_;
  tokens_ = true;
  HPCTRAIN_VERIFY(transform_.is_identity() && config.data.normalize.empty(), InputError,
                  context << ": " << description_ << " holds token data (" << tokens_dataset
                          << "), and the feature transforms ("
                          << (config.data.normalize.empty() ? transform_.description() : "data.normalize")
                          << ") do not apply to token ids",
                  "remove data.log1p, data.scale, data.shift, data.normalize, data.mean and data.std from the deck");
  std::int64_t length = config.data.sequence_length;
  for (const std::string& file : files_) {
    auto part = std::make_unique<Part>();
    part->file = file;
    TokenFileInfo info;
    try {
      info = read_token_file_info(file);
      part->features = std::make_unique<Hdf5Dataset>(file, tokens_dataset);
    } catch (const InputError& error) {
      throw InputError(context + ": " + error.what(), error.hint(), error.scope());
    }
    if (parts_.empty()) {
      vocabulary_ = info.vocabulary;
      if (length == 0) length = info.sequence_length;
      HPCTRAIN_VERIFY(length > 0, InputError,
                      context << ": '" << file << "' holds token data without a " << sequence_length_attribute
                              << " attribute, and data.sequence_length is not set",
                      "set data.sequence_length = T (the tokens of one sample) under [data]");
    } else {
      HPCTRAIN_VERIFY(info.vocabulary == vocabulary_, InputError,
                      context << ": '" << file << "' has a vocabulary of " << info.vocabulary << " tokens, but '"
                              << files_.front() << "' has " << vocabulary_,
                      "every file of one split must come from the same tokenizer");
    }
    part_begins_.push_back(samples_);
    samples_ += token_windows(info.tokens, length);
    parts_.push_back(std::move(part));
  }
  part_begins_.push_back(samples_);
  feature_width_ = length;
  sample_shape_ = {length};
  HPCTRAIN_VERIFY(samples_ > 0, InputError,
                  context << ": " << description_ << " holds no window of " << length + 1
                          << " tokens (a sample is T + 1 tokens, T = " << length << ")",
                  "use a smaller data.sequence_length, or more tokens");
}

void TrainingData::read_window(std::int64_t sample, std::int32_t* out) const {
  const std::size_t part = part_of(sample);
  const Part& piece = *parts_[part];
  const std::int64_t first_token = (sample - part_begins_[part]) * feature_width_;
  piece.guarded(where_ + ": " + split_key_, tokens_dataset,
                [&] { piece.features->read_range(first_token, feature_width_ + 1, out); });
}

void TrainingData::validate_tokens(MPI_Comm comm) const {
  int ranks = 1, rank = 0;
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(comm, &ranks));
  HPCTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const auto [begin, end] = rank_slice(samples_, ranks, rank);
  const std::int64_t length = feature_width_;
  std::int64_t first_bad = no_sample;  // window
  std::vector<std::int32_t> tokens;    // (block) read in bounded blocks of whole windows
  const std::int64_t windows_per_block = std::max<std::int64_t>(1, validation_block_values / length);
  const auto bad = [&](std::int32_t id) { return id < 0 || id >= vocabulary_; };
  for_each_piece(
      begin, end - begin, [&](const Part& part, std::int64_t local_first, std::int64_t rows, std::int64_t offset) {
        for (std::int64_t window = local_first; window < local_first + rows && first_bad == no_sample;
             window += windows_per_block) {
          const std::int64_t windows = std::min(windows_per_block, local_first + rows - window);
          tokens.resize(static_cast<std::size_t>(windows * length + 1));
          part.guarded(where_ + ": " + split_key_, tokens_dataset,
                       [&] { part.features->read_range(window * length, windows * length + 1, tokens.data()); });
          const auto found = std::find_if(tokens.begin(), tokens.end(), bad);
          if (found != tokens.end())
            first_bad = begin + offset + (window - local_first) +
                        std::min<std::int64_t>((found - tokens.begin()) / length, windows - 1);
        }
      });
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT64_T, MPI_MIN, comm));
  if (first_bad == no_sample) return;
  tokens.resize(static_cast<std::size_t>(length + 1));
  read_window(first_bad, tokens.data());
  const auto found = std::find_if(tokens.begin(), tokens.end(), bad);
  const std::size_t part = part_of(first_bad);
  const std::int64_t position = (first_bad - part_begins_[part]) * length + (found - tokens.begin());
  throw InputError(where_ + ": " + split_key_ + ": token id " + std::to_string(*found) + " at position " +
                       std::to_string(position) + " of " + tokens_dataset + " in '" + parts_[part]->file +
                       "' (window " + std::to_string(first_bad) + ") is outside [0, " + std::to_string(vocabulary_) +
                       "), the file's " + vocabulary_attribute,
                   "every id must be below the vocabulary size: fix the ids or the attribute (hpctrain data convert "
                   "--tokens checks them)");
}

void TrainingData::set_up_standardisation(const RunConfig& config) {
  std::string source = config.data.normalized_from;
  if (!config.data.normalize.empty()) {  // not resolved by the caller: read the file now
    const NormalizationValues values = read_normalization_file(config.data.normalize, config.where("data.normalize"));
    transform_.mean.assign(values.mean.begin(), values.mean.end());
    transform_.std.assign(values.std.begin(), values.std.end());
    source = config.data.normalize;
  }
  if (transform_.mean.empty()) return;
  // A channel is the second dimension: (N, F) has F, (N, C, H, W) has C of H * W values.
  const std::int64_t channels = sample_shape_.empty() ? 1 : sample_shape_.front();
  const std::string key = source.empty() ? "data.mean/data.std" : "data.normalize = \"" + source + "\"";
  HPCTRAIN_VERIFY(static_cast<std::int64_t>(transform_.mean.size()) == channels, InputError,
                  config.where(source.empty() ? "data.mean" : "data.normalize")
                      << ": " << key << " has " << transform_.mean.size() << " values per statistic, but the features '"
                      << config.data.features << "' of " << split_key_ << " (" << description_ << ") have " << channels
                      << " channel" << (channels == 1 ? "" : "s") << " (sample shape " << shape_text(sample_shape_)
                      << ")",
                  "compute the statistics from this data: hpctrain data inspect TRAIN.h5 --stats-out stats.h5");
  transform_.row = feature_width_;
  transform_.inner = feature_width_ / channels;
}

TrainingData::~TrainingData() = default;

std::vector<float> TrainingData::transformed_zero_per_channel() const {
  const std::int64_t channels = sample_shape_.empty() ? 1 : sample_shape_.front();
  std::vector<float> zero_row(static_cast<std::size_t>(feature_width_), 0.0f);
  transform_.apply(zero_row.data(), feature_width_);
  std::vector<float> values(static_cast<std::size_t>(channels));
  for (std::int64_t c = 0; c < channels; ++c) values[c] = zero_row[c * (feature_width_ / channels)];
  return values;
}

void TrainingData::set_up_augmentation(const RunConfig& config) {
  augmentation_ = SampleAugmentation::from_deck(config, sample_shape_, description_, transformed_zero_per_channel());
}

std::size_t TrainingData::part_of(std::int64_t sample) const {
  // The last part whose first sample is <= sample (empty files share their begin with the next one: skip them).
  const auto it = std::upper_bound(part_begins_.begin(), part_begins_.end() - 1, sample);
  return static_cast<std::size_t>(it - part_begins_.begin()) - 1;
}

template <class Visit>
void TrainingData::for_each_piece(std::int64_t first, std::int64_t count, Visit&& visit) const {
  std::int64_t done = 0;
  while (done < count) {
    const std::size_t part = part_of(first + done);
    const std::int64_t local_first = first + done - part_begins_[part];
    const std::int64_t rows = std::min(count - done, part_begins_[part + 1] - (first + done));
    visit(*parts_[part], local_first, rows, done);
    done += rows;
  }
}

void TrainingData::read_range(std::int64_t first, std::int64_t count, float* features, std::int32_t* labels,
                              float* targets) const {
  const std::string context = where_ + ": " + split_key_;
  for_each_piece(first, count, [&](const Part& part, std::int64_t local_first, std::int64_t rows, std::int64_t offset) {
    part.guarded(context, part.features->path(),
                 [&] { part.features->read_range(local_first, rows, features + offset * feature_width_); });
    if (!answers_) return;
    part.guarded(context, part.answers->path(), [&] {
      if (labels != nullptr) part.answers->read_range(local_first, rows, labels + offset);
      if (targets != nullptr) part.answers->read_range(local_first, rows, targets + offset * target_width_);
    });
  });
  transform_.apply(features, count * feature_width_);
}

std::optional<PageMapping> TrainingData::feature_map_pages() const {
  std::optional<PageMapping> total;
  for (const auto& part : parts_)
    if (const std::optional<PageMapping> pages = part->features->map_pages()) {
      if (!total) total.emplace();
      total->resident_bytes += pages->resident_bytes;
      total->huge_bytes += pages->huge_bytes;
    }
  return total;
}

void TrainingData::validate(const MpiEnvironment& mpi, std::int64_t classes) const {
  if (tokens_) return validate_tokens(mpi.world());
  const auto [begin, end] = rank_slice(samples_, mpi.size(), mpi.rank());
  std::int64_t first_bad[2] = {no_sample, no_sample};  // features, answers
  const std::int64_t rows_per_block =
      std::max<std::int64_t>(1, validation_block_values / std::max(feature_width_, target_width_));
  const bool classification = task_ == TaskKind::classification, labels_read = answers_ && classification,
             targets_read = answers_ && !classification;
  // Labels stored as floating point must be whole numbers: converting 1.5 to an integer label would change it.
  const bool fractional_possible = labels_read && std::any_of(parts_.begin(), parts_.end(), [](const auto& part) {
                                     return !part->answers->stores_integers();
                                   });
  std::vector<double> label_values;  // (block), when fractional_possible
  std::int64_t first_fractional = no_sample;
  std::vector<float> features;       // (block, feature_width)
  std::vector<std::int32_t> labels;  // (block)
  std::vector<float> targets;        // (block, target_width)
  for (std::int64_t block = begin; block < end && first_bad[0] == no_sample && first_bad[1] == no_sample;
       block += rows_per_block) {
    const std::int64_t rows = std::min(rows_per_block, end - block);
    features.resize(static_cast<std::size_t>(rows * feature_width_));
    labels.resize(labels_read ? static_cast<std::size_t>(rows) : 0);
    targets.resize(targets_read ? static_cast<std::size_t>(rows * target_width_) : 0);
    read_range(block, rows, features.data(), labels_read ? labels.data() : nullptr,
               targets_read ? targets.data() : nullptr);
    for (std::int64_t i = 0; i < rows * feature_width_; ++i)
      if (!std::isfinite(features[static_cast<std::size_t>(i)])) {
        first_bad[0] = block + i / feature_width_;
        break;
      }
    if (labels_read) {
      for (std::int64_t i = 0; i < rows; ++i)
        if (labels[static_cast<std::size_t>(i)] < 0 || labels[static_cast<std::size_t>(i)] >= classes) {
          first_bad[1] = block + i;
          break;
        }
      if (fractional_possible && first_fractional == no_sample) {
        label_values.resize(static_cast<std::size_t>(rows));
        for_each_piece(
            block, rows, [&](const Part& part, std::int64_t local_first, std::int64_t count, std::int64_t offset) {
              part.guarded(where_ + ": " + split_key_, part.answers->path(),
                           [&] { part.answers->read_range(local_first, count, label_values.data() + offset); });
            });
        for (std::int64_t i = 0; i < rows; ++i)
          if (const double value = label_values[static_cast<std::size_t>(i)]; value != std::floor(value)) {
            first_fractional = block + i;
            break;
          }
      }
    } else if (targets_read) {
      for (std::int64_t i = 0; i < rows * target_width_; ++i)
        if (!std::isfinite(targets[static_cast<std::size_t>(i)])) {
          first_bad[1] = block + i / target_width_;
          break;
        }
    }
  }
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, first_bad, 2, MPI_INT64_T, MPI_MIN, mpi.world()));
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_fractional, 1, MPI_INT64_T, MPI_MIN, mpi.world()));

  // "in 'b.h5'" for a single file; "in 'b.h5' (its row 23)" when the split has several.
  auto location_of = [&](std::int64_t sample) {
    const std::size_t part = part_of(sample);
    std::string text = "'" + parts_[part]->file + "'";
    if (parts_.size() > 1) text += " (its row " + std::to_string(sample - part_begins_[part]) + ")";
    return text;
  };
  // Each rank checked its own slice, so the report names the rank that found the sample: on a job that reads from
  // node-local copies, that says which node's file to look at. Every rank knows it after the reductions, so the
  // error stays one every rank throws (printed once, ending the job at once).
  auto found_by = [&](std::int64_t sample) {
    if (mpi.size() == 1) return std::string();
    int rank = 0;
    while (rank + 1 < mpi.size() && sample >= rank_slice(samples_, mpi.size(), rank).second) ++rank;
    return " (found by rank " + std::to_string(rank) + " of " + std::to_string(mpi.size()) + ")";
  };
  const std::string context = where_ + ": " + split_key_;
  if (first_bad[0] != no_sample) {
    const std::string transformed = transform_.is_identity() ? "" : " after " + transform_.description();
    throw InputError(context + ": features in " + location_of(first_bad[0]) + " contain NaN or Inf" + transformed +
                         " (first at sample " + std::to_string(first_bad[0]) + ")" + found_by(first_bad[0]),
                     transform_.log1p
                         ? "data.log1p needs features > -1; clean or drop the bad samples first"
                         : "clean or drop those samples before training; 'hpctrain data inspect' shows the "
                           "file's contents");
  }
  if (first_fractional != no_sample) {
    const Part& part = *parts_[part_of(first_fractional)];
    const std::int64_t row = first_fractional - part_begins_[part_of(first_fractional)];
    double value = 0.0;
    part.guarded(context, part.answers->path(), [&] { part.answers->read_range(row, 1, &value); });
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", value);
    throw InputError(context + ": labels '" + part.answers->path() + "' in " + location_of(first_fractional) +
                         " are not whole numbers: sample " + std::to_string(first_fractional) + " has label " + text +
                         found_by(first_fractional),
                     "class labels are integers 0..C-1 (store them as an integer dataset); for real-valued targets "
                     "use model.loss = \"mse\" with data.targets");
  }
  if (first_bad[1] == no_sample) return;
  if (classification) {
    std::int32_t bad_label = 0;
    const Part& part = *parts_[part_of(first_bad[1])];
    const std::int64_t row = first_bad[1] - part_begins_[part_of(first_bad[1])];
    part.guarded(context, part.answers->path(), [&] { part.answers->read_rows(&row, 1, &bad_label); });
    throw InputError(context + ": label " + std::to_string(bad_label) + " of sample " + std::to_string(first_bad[1]) +
                         " in " + location_of(first_bad[1]) + " is outside [0, " + std::to_string(classes) +
                         "), the model's " + std::to_string(classes) + " outputs" + found_by(first_bad[1]),
                     "make the last linear layer's 'out' the number of classes, or fix the labels");
  }
  throw InputError(context + ": targets in " + location_of(first_bad[1]) + " contain NaN or Inf (first at sample " +
                       std::to_string(first_bad[1]) + ")" + found_by(first_bad[1]),
                   "clean or drop those samples before training");
}

void TrainingData::reserve(HostBatch& batch, std::int64_t rows) const {
  const auto at_least = [](auto& values, std::int64_t size) {
    if (values.size() < static_cast<std::size_t>(size)) values.resize(static_cast<std::size_t>(size));
  };
  batch.sample_ids.reserve(static_cast<std::size_t>(rows));
  if (tokens_) {
    at_least(batch.tokens, rows * feature_width_);
    at_least(batch.token_targets, rows * feature_width_);
    return;
  }
  at_least(batch.features, rows * feature_width_);
  if (!answers_) return;
  if (task_ == TaskKind::classification) {
    at_least(batch.labels, rows);
  } else {
    at_least(batch.targets, rows * target_width_);
  }
}

template <class Value>
void TrainingData::gather(bool features, const std::int64_t* indices, std::int64_t count, std::int64_t width,
                          Value* out) const {
  const std::string context = where_ + ": " + split_key_;
  auto read_part = [&](const Part& part, const std::int64_t* rows, std::int64_t rows_count, Value* destination) {
    Hdf5Dataset& dataset = features ? *part.features : *part.answers;
    part.guarded(context, dataset.path(), [&] { dataset.read_rows(rows, rows_count, destination); });
  };
  if (parts_.size() == 1) {
    read_part(*parts_.front(), indices, count, out);
    return;
  }
  // Group the requests by file (a counting sort of their positions), read each file's rows in one go, then put every
  // row where the batch wants it.
  const std::size_t parts = parts_.size();
  part_request_begins_.assign(parts + 1, 0);
  for (std::int64_t i = 0; i < count; ++i) ++part_request_begins_[part_of(indices[i]) + 1];
  for (std::size_t p = 0; p < parts; ++p) part_request_begins_[p + 1] += part_request_begins_[p];
  requests_by_part_.resize(static_cast<std::size_t>(count));
  local_rows_.assign(part_request_begins_.begin(), part_request_begins_.end() - 1);  // fill cursors per part
  for (std::int64_t i = 0; i < count; ++i) {
    const std::size_t part = part_of(indices[i]);
    requests_by_part_[static_cast<std::size_t>(local_rows_[part]++)] = i;
  }
  const std::size_t row_bytes = static_cast<std::size_t>(width) * sizeof(Value);
  for (std::size_t p = 0; p < parts; ++p) {
    const std::int64_t begin = part_request_begins_[p], end = part_request_begins_[p + 1];
    if (begin == end) continue;
    local_rows_.resize(static_cast<std::size_t>(end - begin));
    for (std::int64_t j = begin; j < end; ++j)
      local_rows_[static_cast<std::size_t>(j - begin)] =
          indices[requests_by_part_[static_cast<std::size_t>(j)]] - part_begins_[p];
    gathered_.resize(static_cast<std::size_t>(end - begin) * row_bytes);  // (requests of this part, width)
    read_part(*parts_[p], local_rows_.data(), end - begin, reinterpret_cast<Value*>(gathered_.data()));
    for (std::int64_t j = begin; j < end; ++j)
      copy_bytes(out + requests_by_part_[static_cast<std::size_t>(j)] * width,
                 gathered_.data() + static_cast<std::size_t>(j - begin) * row_bytes, row_bytes);
  }
}

void TrainingData::read(const std::int64_t* indices, std::int64_t count, HostBatch& batch) const {
  reserve(batch, count);
  batch.rows = count;
  batch.sample_ids.assign(indices, indices + count);
  const bool classification = task_ == TaskKind::classification;

  bool from_memory = memory_count_ > 0;
  for (std::int64_t i = 0; i < count && from_memory; ++i)
    from_memory = indices[i] >= memory_first_ && indices[i] - memory_first_ < memory_count_;
  if (tokens_) {
    const std::int64_t length = feature_width_;
    window_.resize(static_cast<std::size_t>(length + 1));
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int32_t* window = window_.data();
      if (from_memory) {
        window = memory_windows_.get() + (indices[i] - memory_first_) * (length + 1);
      } else {
        read_window(indices[i], window_.data());
      }
      copy_bytes(batch.tokens.data() + i * length, window, static_cast<std::size_t>(length) * sizeof(std::int32_t));
      copy_bytes(batch.token_targets.data() + i * length, window + 1,
                 static_cast<std::size_t>(length) * sizeof(std::int32_t));
    }
    return;
  }
  if (from_memory) {
    // Random rows of the staged copy: the same prefetch as the file's scattered reads (core/copy_bytes.hpp).
    const RowPrefetch prefetch(static_cast<std::size_t>(feature_width_) * sizeof(float));
    for (std::int64_t i = 0; i < std::min(count, prefetch.rows_ahead()); ++i)
      prefetch(memory_features_.get() + (indices[i] - memory_first_) * feature_width_);
    for (std::int64_t i = 0; i < count; ++i) {
      if (const std::int64_t ahead = i + prefetch.rows_ahead(); ahead < count)
        prefetch(memory_features_.get() + (indices[ahead] - memory_first_) * feature_width_);
      const std::int64_t row = indices[i] - memory_first_;
      copy_bytes(batch.features.data() + i * feature_width_, memory_features_.get() + row * feature_width_,
                 static_cast<std::size_t>(feature_width_) * sizeof(float));
      if (!answers_) continue;
      if (classification) {
        batch.labels[static_cast<std::size_t>(i)] = memory_labels_[static_cast<std::size_t>(row)];
      } else {
        copy_bytes(batch.targets.data() + i * target_width_, memory_targets_.get() + row * target_width_,
                   static_cast<std::size_t>(target_width_) * sizeof(float));
      }
    }
    return;
  }
  gather(true, indices, count, feature_width_, batch.features.data());
  transform_.apply(batch.features.data(), count * feature_width_);
  if (!answers_) return;
  if (classification) {
    gather(false, indices, count, 1, batch.labels.data());
  } else {
    gather(false, indices, count, target_width_, batch.targets.data());
  }
}

void TrainingData::load_into_memory(std::int64_t first, std::int64_t count, bool huge_pages) {
  HPCTRAIN_ASSERT(first >= 0 && count >= 0 && first + count <= samples_,
                  "rows [" << first << ", " << first + count << ") outside [0, " << samples_ << ")");
  const bool classification = task_ == TaskKind::classification;
  memory_count_ = 0;         // until the copy is complete, reads go to the files
  memory_features_.reset();  // free the old copy before making the new one
  memory_labels_.reset();
  memory_targets_.reset();
  memory_windows_.reset();
  if (tokens_) {
    const std::int64_t width = feature_width_ + 1;
    memory_windows_ = allocate_staged_array<std::int32_t>(static_cast<std::size_t>(count * width), huge_pages);
    for (std::int64_t i = 0; i < count; ++i) read_window(first + i, memory_windows_.get() + i * width);
    memory_first_ = first;
    memory_count_ = count;
    return;
  }
  // Not zero-filled: the read fills it, so staging touches the memory once (first touch, a page fault per 4 KiB, is
  // most of staging's cost already; huge pages cut that, but may stall on compaction on a busy node: asked for only).
  memory_features_ = allocate_staged_array<float>(static_cast<std::size_t>(count * feature_width_), huge_pages);
  if (answers_ && classification) {
    memory_labels_ = allocate_staged_array<std::int32_t>(static_cast<std::size_t>(count), huge_pages);
  } else if (answers_) {
    memory_targets_ = allocate_staged_array<float>(static_cast<std::size_t>(count * target_width_), huge_pages);
  }
  read_range(first, count, memory_features_.get(), memory_labels_.get(), memory_targets_.get());
  memory_first_ = first;
  memory_count_ = count;
}

}  // namespace hpctrain
