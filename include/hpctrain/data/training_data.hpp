// One split (train or validation) of the data as one rank sees it: the features and labels/targets datasets of one or
// more HDF5 files read as one concatenated dataset, checked against each other and against the model at start-up, and
// read a batch at a time (only the rows this rank needs), or from memory once loaded there.
//
// Features of any rank >= 2 ((N, F), (N, C, H, W), (N, C, D, H, W), ...) are flattened to one row per sample; their
// per-sample shape stays available (sample_shape()). The deck's transforms (data.log1p, data.scale, data.shift) are
// applied to the features as they are read, in that order.
//
// Token data (files with a /tokens stream, data/tokens.hpp) is read the same way: a sample is a window of T + 1
// tokens (T = data.sequence_length or the files' attribute), samples() counts the windows of all files, and read()
// fills HostBatch::tokens and token_targets instead of features and labels. The sampler, the loader and the rank's
// share work unchanged on windows: each rank reads only its own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hpctrain/config/choices.hpp"
#include "hpctrain/core/page_mapping.hpp"
#include "hpctrain/core/staged_array.hpp"
#include "hpctrain/data/augmentation.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

class Hdf5Dataset;
struct RunConfig;
struct DataSection;

enum class TaskKind { classification, regression };

// What the model's loss makes of the data: class labels for cross-entropy, real-valued targets for MSE.
constexpr TaskKind task_of(LossKind loss) {
  return loss == LossKind::mse ? TaskKind::regression : TaskKind::classification;
}

// What a split is read for: training and evaluation need the labels/targets, predictions the features alone.
enum class DataContents { features_and_answers, features_only };

// A batch in host memory, rows in the order the sampler gave them.
struct HostBatch {
  std::int64_t rows = 0;
  std::vector<std::int64_t> sample_ids;  // (rows) global sample indices
  std::vector<float> features;           // (rows, feature_width)
  std::vector<std::int32_t> labels;      // (rows) classification
  std::vector<float> targets;            // (rows, target_width) regression
  // Token data (holds_tokens()): sample i is the window of T + 1 tokens from token i x T of its file.
  std::vector<std::int32_t> tokens;         // (rows, T) the first T tokens of each window: the model's input
  std::vector<std::int32_t> token_targets;  // (rows, T) the last T: the next token at every position
};

// x -> scale * log1p(x) + shift (log1p only when set), then (x - mean[c]) / std[c] per channel c when data.mean/std
// (or data.normalize) are set. log1p first so that scale and shift can standardise the log-transformed values, which
// is what a heavy-tailed feature needs.
struct FeatureTransform {
  bool log1p = false;
  float scale = 1.0f;
  float shift = 0.0f;
  std::vector<float> mean, std;  // (channels) or empty
  std::int64_t row = 0;          // values per sample, a multiple of mean.size(); set with the data's shape
  std::int64_t inner = 1;        // values per channel within a sample (H * W for images)

  static FeatureTransform from(const DataSection& section);
  [[nodiscard]] bool is_identity() const { return !log1p && scale == 1.0f && shift == 0.0f && mean.empty(); }
  void apply(float* values, std::int64_t count) const;  // in place; count is a multiple of row
  [[nodiscard]] std::string description() const;        // "log1p, then * 0.5, then + 1" for messages
};

class TrainingData;

// A start-up hint when the features look stored channels-last ((N, H, W, C) read as (N, C, H, W)): a rank-3 or rank-4
// sample shape whose last axis is 1, 3 or 4 while the "channel" axis is at least 8 and larger. "" when they do not.
std::string channels_last_hint(const TrainingData& data, const std::string& features_path);

class TrainingData {
 public:
  // split_key: "data.train" or "data.validation" (names the deck key in messages); patterns: its files or glob
  // patterns, concatenated in order. Throws InputError.
  // data.normalize, when still set (not resolved into data.mean/std), is read here.
  TrainingData(const RunConfig& config, const std::string& split_key, const std::vector<std::string>& patterns,
               TaskKind task, DataContents contents = DataContents::features_and_answers);
  TrainingData(const RunConfig& config, const std::string& split_key, const std::string& file, TaskKind task,
               DataContents contents = DataContents::features_and_answers);
  ~TrainingData();
  TrainingData(const TrainingData&) = delete;
  TrainingData& operator=(const TrainingData&) = delete;

  [[nodiscard]] std::int64_t samples() const { return samples_; }
  [[nodiscard]] std::int64_t feature_width() const { return feature_width_; }
  [[nodiscard]] std::int64_t target_width() const { return target_width_; }  // 1 for labels
  // The shape of one sample's features, e.g. {784} for (N, 784) or {1, 28, 28} for (N, 1, 28, 28).
  [[nodiscard]] const std::vector<std::int64_t>& sample_shape() const { return sample_shape_; }
  // The shape a model reads one sample as: sample_shape(), or (1) for one feature per sample (features stored as (N)).
  [[nodiscard]] std::vector<std::int64_t> model_input_shape() const {
    return sample_shape_.empty() ? std::vector<std::int64_t>{feature_width_} : sample_shape_;
  }
  [[nodiscard]] TaskKind task() const { return task_; }
  // Token data: the windows' length T (feature_width() too) and the vocabulary (ids lie in [0, vocabulary)).
  [[nodiscard]] bool holds_tokens() const { return tokens_; }
  [[nodiscard]] std::int64_t sequence_length() const { return tokens_ ? feature_width_ : 0; }
  [[nodiscard]] std::int64_t vocabulary() const { return vocabulary_; }
  // The files, after glob expansion, in concatenation order.
  [[nodiscard]] const std::vector<std::string>& files() const { return files_; }
  // The files for messages: "a.h5" or "a.h5 (and 3 more files)".
  [[nodiscard]] const std::string& file() const { return description_; }

  // Check every value once, each rank its own contiguous 1/R of the data: labels in [0, classes) (classification),
  // finite features (after the transforms) and targets (not read with DataContents::features_only); token ids in
  // [0, vocabulary()) (classes is not used). Ranks agree on the first bad sample, and one message names it.
  void validate(const MpiEnvironment& mpi, std::int64_t classes) const;
  // validate() of token data, on the ranks of `comm` (tests pass MPI_COMM_WORLD).
  void validate_tokens(MPI_Comm comm) const;

  // Size batch's buffers for `rows` rows, so that later reads of up to that many rows allocate nothing.
  void reserve(HostBatch& batch, std::int64_t rows) const;
  // Read the rows `indices` (any order, repeats allowed) into batch (grown if needed, never shrunk). Reads from memory
  // when every row is there (load_into_memory), from the files otherwise. One reader at a time: the scratch space for
  // spreading a batch over several files is shared.
  void read(const std::int64_t* indices, std::int64_t count, HostBatch& batch) const;

  // Keep the rows [first, first + count) in memory, transformed, from now on (the rank's share with data.in_memory, or
  // its slice with data.shuffle = "local"), on huge pages where asked (data.huge_pages). Reads them in large
  // contiguous blocks.
  void load_into_memory(std::int64_t first, std::int64_t count, bool huge_pages = false);
  [[nodiscard]] std::int64_t rows_in_memory() const { return memory_count_; }
  // How the kernel maps the feature files' memory maps now, summed over the files read directly (nothing when none is).
  [[nodiscard]] std::optional<PageMapping> feature_map_pages() const;

  // The training split: check the deck's data.augment_* keys against these samples (InputError naming the key) and
  // keep the augmentation the BatchLoader applies to every batch it reads. Never called for the other splits.
  void set_up_augmentation(const RunConfig& config);
  // nullptr when there is none (no key set, or not the training split).
  [[nodiscard]] const SampleAugmentation* augmentation() const { return augmentation_ ? &*augmentation_ : nullptr; }
  // (channels: the first dimension of the sample shape, 1 for flat features) the value a raw 0 becomes after the
  // transforms: what augmentation pads with.
  [[nodiscard]] std::vector<float> transformed_zero_per_channel() const;

 private:
  struct Part;  // one file: its datasets and where its samples start in the concatenation
  // Visit the pieces of the sample range [first, first + count) that lie in each file: (part, first row there, rows,
  // offset of the piece in the range).
  template <class Visit>
  void for_each_piece(std::int64_t first, std::int64_t count, Visit&& visit) const;
  // Rows [first, first + count) of the concatenation, features transformed: features (count, feature_width),
  // labels (count) or targets (count, target_width).
  void read_range(std::int64_t first, std::int64_t count, float* features, std::int32_t* labels, float* targets) const;
  template <class Value>
  void gather(bool features, const std::int64_t* indices, std::int64_t count, std::int64_t width, Value* out) const;
  std::size_t part_of(std::int64_t sample) const;
  void set_up_standardisation(const RunConfig& config);  // data.normalize or data.mean/std against the data's shape
  void set_up_tokens(const RunConfig& config);           // the constructor for token files
  // The window of T + 1 tokens of `sample` into out.
  void read_window(std::int64_t sample, std::int32_t* out) const;

  std::string split_key_, where_, description_;
  std::vector<std::string> files_;
  TaskKind task_;
  bool answers_ = true;  // labels/targets are read (not with DataContents::features_only)
  FeatureTransform transform_;
  std::vector<std::unique_ptr<Part>> parts_;
  std::vector<std::int64_t> part_begins_;  // (parts + 1): first global sample of each part, then the total
  std::int64_t samples_ = 0, feature_width_ = 0, target_width_ = 1;
  std::vector<std::int64_t> sample_shape_;
  std::optional<SampleAugmentation> augmentation_;
  bool tokens_ = false;
  std::int64_t vocabulary_ = 0;

  // Rows kept in memory: [memory_first_, memory_first_ + memory_count_).
  std::int64_t memory_first_ = 0, memory_count_ = 0;
  StagedArray<float> memory_features_;        // (memory_count, feature_width)
  StagedArray<std::int32_t> memory_labels_;   // (memory_count) classification
  StagedArray<float> memory_targets_;         // (memory_count, target_width) regression
  StagedArray<std::int32_t> memory_windows_;  // (memory_count, T + 1) token data

  // Scratch for batches that span several files, reused from batch to batch.
  mutable std::vector<std::int64_t> requests_by_part_;     // (count) request positions, grouped by part
  mutable std::vector<std::int64_t> part_request_begins_;  // (parts + 1)
  mutable std::vector<std::int64_t> local_rows_;           // (requests of one part) rows inside that part's file
  mutable std::vector<unsigned char> gathered_;            // (requests of one part, width) values read from one file
  mutable std::vector<std::int32_t> window_;               // (T + 1) one token window
};

}  // namespace hpctrain
