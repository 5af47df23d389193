// One split (train or validation) of the data as one rank sees it: the features and labels/targets datasets of an HDF5
// file, checked against each other and against the model at start-up, read a batch at a time (only the rows this rank
// needs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

class Hdf5Dataset;
struct RunConfig;

enum class TaskKind { classification, regression };

// A batch in host memory, rows in the order the sampler gave them.
struct HostBatch {
  std::int64_t rows = 0;
  std::vector<std::int64_t> sample_ids;  // (rows) global sample indices
  std::vector<float> features;           // (rows, feature_width)
  std::vector<std::int32_t> labels;      // (rows) classification
  std::vector<float> targets;            // (rows, target_width) regression
};

class TrainingData {
 public:
  // split_key: "data.train" or "data.validation" (names the deck key in messages). Throws InputError.
  TrainingData(const RunConfig& config, const std::string& split_key, const std::string& file, TaskKind task);
  ~TrainingData();

  [[nodiscard]] std::int64_t samples() const { return samples_; }
  [[nodiscard]] std::int64_t feature_width() const { return feature_width_; }
  [[nodiscard]] std::int64_t target_width() const { return target_width_; }  // 1 for labels
  [[nodiscard]] const std::string& file() const { return file_; }

  // Check every value once, each rank its own contiguous 1/R of the file: labels in [0, classes) (classification),
  // finite features and targets. Ranks agree on the first bad sample, and one message names it.
  void validate(const MpiEnvironment& mpi, std::int64_t classes) const;
  // Read the rows `indices` into batch (resized once to the largest batch, never shrunk).
  void read(const std::int64_t* indices, std::int64_t count, HostBatch& batch) const;

 private:
  std::string split_key_, file_, where_;
  TaskKind task_;
  std::unique_ptr<Hdf5Dataset> features_, answers_;
  std::int64_t samples_ = 0, feature_width_ = 0, target_width_ = 1;
};

}  // namespace hpctrain
