// A data split as one rank sees it: start-up checks and batch reads.
#include "hpctrain/data/training_data.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"

namespace hpctrain {

namespace {
// Rows checked per read during validation: bounded memory whatever the file size.
constexpr std::int64_t validation_block_values = 1 << 20;
}  // namespace

TrainingData::TrainingData(const RunConfig& config, const std::string& split_key, const std::string& file,
                           TaskKind task)
    : split_key_(split_key), file_(file), where_(config.where(split_key)), task_(task) {
  const std::string answers_path = task == TaskKind::classification ? config.data.labels : config.data.targets;
  const std::string answers_key = task == TaskKind::classification ? "data.labels" : "data.targets";
  try {
    features_ = std::make_unique<Hdf5Dataset>(file, config.data.features);
    answers_ = std::make_unique<Hdf5Dataset>(file, answers_path);
  } catch (const InputError& error) {
    throw InputError(where_ + ": " + split_key + ": " + error.what(), error.hint());
  }
  const auto feature_shape = features_->shape();
  const auto answer_shape = answers_->shape();
  HPCTRAIN_VERIFY(feature_shape.size() >= 2, InputError,
                  where_ << ": " << split_key << ": features '" << config.data.features << "' in '" << file
                         << "' have shape " << shape_text(feature_shape) << "; expected (samples, features...)",
                  "store one sample per row: a 2-D (or higher) dataset whose first dimension is the sample");
  samples_ = feature_shape[0];
  feature_width_ = features_->sample_size();
  HPCTRAIN_VERIFY(answer_shape[0] == samples_, InputError,
                  where_ << ": " << split_key << ": '" << file << "' has " << samples_ << " samples in '"
                         << config.data.features << "' but " << answer_shape[0] << " in '" << answers_path << "'",
                  "features and " + std::string(task == TaskKind::classification ? "labels" : "targets") +
                      " must have one row per sample");
  if (task == TaskKind::classification) {
    HPCTRAIN_VERIFY(answer_shape.size() == 1 || (answer_shape.size() == 2 && answer_shape[1] == 1), InputError,
                    where_ << ": " << split_key << ": labels '" << answers_path << "' have shape "
                           << shape_text(answer_shape) << "; cross_entropy needs one integer label per sample",
                    "store labels as a 1-D integer dataset (N), or use model.loss = \"mse\" with " + answers_key);
  } else {
    target_width_ = answers_->sample_size();
  }
  HPCTRAIN_VERIFY(samples_ > 0, InputError, where_ << ": " << split_key << ": '" << file << "' holds no samples");
}

TrainingData::~TrainingData() = default;

void TrainingData::validate(const MpiEnvironment& mpi, std::int64_t classes) const {
  // This rank's contiguous share.
  const std::int64_t share = (samples_ + mpi.size() - 1) / mpi.size();
  const std::int64_t begin = std::min<std::int64_t>(share * mpi.rank(), samples_);
  const std::int64_t end = std::min<std::int64_t>(begin + share, samples_);
  std::int64_t first_bad[2] = {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max()};
  const std::int64_t rows_per_block =
      std::max<std::int64_t>(1, validation_block_values / std::max(feature_width_, target_width_));
  std::vector<float> values;
  std::vector<std::int32_t> labels;
  for (std::int64_t block = begin; block < end && first_bad[0] == std::numeric_limits<std::int64_t>::max() &&
                                   first_bad[1] == std::numeric_limits<std::int64_t>::max();
       block += rows_per_block) {
    const std::int64_t rows = std::min(rows_per_block, end - block);
    values.resize(static_cast<std::size_t>(rows * feature_width_));
    features_->read_range(block, rows, values.data());
    for (std::int64_t i = 0; i < rows * feature_width_; ++i)
      if (!std::isfinite(values[static_cast<std::size_t>(i)])) {
        first_bad[0] = block + i / feature_width_;
        break;
      }
    if (task_ == TaskKind::classification) {
      labels.resize(static_cast<std::size_t>(rows));
      answers_->read_range(block, rows, labels.data());
      for (std::int64_t i = 0; i < rows; ++i)
        if (labels[static_cast<std::size_t>(i)] < 0 || labels[static_cast<std::size_t>(i)] >= classes) {
          first_bad[1] = block + i;
          break;
        }
    } else {
      values.resize(static_cast<std::size_t>(rows * target_width_));
      answers_->read_range(block, rows, values.data());
      for (std::int64_t i = 0; i < rows * target_width_; ++i)
        if (!std::isfinite(values[static_cast<std::size_t>(i)])) {
          first_bad[1] = block + i / target_width_;
          break;
        }
    }
  }
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, first_bad, 2, MPI_INT64_T, MPI_MIN, mpi.world()));
  HPCTRAIN_VERIFY(first_bad[0] == std::numeric_limits<std::int64_t>::max(), InputError,
                  where_ << ": " << split_key_ << ": features in '" << file_ << "' contain NaN or Inf (first at sample "
                         << first_bad[0] << ")",
                  "clean or drop those samples before training; 'hpctrain data inspect' shows the file's contents");
  if (task_ == TaskKind::classification) {
    std::int32_t bad_label = 0;
    if (first_bad[1] != std::numeric_limits<std::int64_t>::max()) answers_->read_rows(&first_bad[1], 1, &bad_label);
    HPCTRAIN_VERIFY(first_bad[1] == std::numeric_limits<std::int64_t>::max(), InputError,
                    where_ << ": " << split_key_ << ": label " << bad_label << " of sample " << first_bad[1] << " in '"
                           << file_ << "' is outside [0, " << classes << "), the model's " << classes << " outputs",
                    "make the last linear layer's 'out' the number of classes, or fix the labels");
  } else {
    HPCTRAIN_VERIFY(first_bad[1] == std::numeric_limits<std::int64_t>::max(), InputError,
                    where_ << ": " << split_key_ << ": targets in '" << file_
                           << "' contain NaN or Inf (first at sample " << first_bad[1] << ")");
  }
}

void TrainingData::read(const std::int64_t* indices, std::int64_t count, HostBatch& batch) const {
  batch.rows = count;
  batch.sample_ids.assign(indices, indices + count);
  batch.features.resize(std::max(batch.features.size(), static_cast<std::size_t>(count * feature_width_)));
  features_->read_rows(indices, count, batch.features.data());
  if (task_ == TaskKind::classification) {
    batch.labels.resize(std::max(batch.labels.size(), static_cast<std::size_t>(count)));
    answers_->read_rows(indices, count, batch.labels.data());
  } else {
    batch.targets.resize(std::max(batch.targets.size(), static_cast<std::size_t>(count * target_width_)));
    answers_->read_rows(indices, count, batch.targets.data());
  }
}

}  // namespace hpctrain
