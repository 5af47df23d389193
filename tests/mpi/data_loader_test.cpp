// Reading the same data (two files, one compressed) on 1, 2 and 4 ranks gives the same global batches: at every step
// the ranks' local batches together are exactly the samples torch.randperm puts in that global batch, with the right
// values, whatever the rank count and with prefetching on. With data.shuffle = "local" the ranks together read every
// sample exactly once per epoch, each rank only its own slice.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/data/batch_loader.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/data/distributed_sampler.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t samples = 204, width = 5, global_batch = 24;
constexpr std::int64_t first_file_rows = 77;

float feature_value(std::int64_t sample, std::int64_t j) { return static_cast<float>(sample * 8 + j); }

class DataLoaderMpiTest : public testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    // Rank 0 writes the files into a directory every rank then reads.
    char name[256] = {};
    if (rank_ == 0) {
      const fs::path directory = fs::temp_directory_path() / ("hpctrain-mpi-loader-" + std::to_string(::getpid()) +
                                                              "-" + std::to_string(std::random_device{}()));
      fs::create_directories(directory);
      std::snprintf(name, sizeof name, "%s", directory.c_str());
      write_part((directory / "part_0.h5").string(), 0, first_file_rows, false);
      write_part((directory / "part_1.h5").string(), first_file_rows, samples - first_file_rows, true);
    }
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
    directory_ = name;
    config_.deck_path = "test.toml";
    config_.data.batch_size = global_batch;
    config_.data.prefetch = 2;
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) {
      std::error_code ignored;
      fs::remove_all(directory_, ignored);
    }
  }

  static void write_part(const std::string& file, std::int64_t first, std::int64_t rows, bool compress) {
    std::vector<float> features(static_cast<std::size_t>(rows * width));  // (rows, width)
    std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < width; ++j) features[r * width + j] = feature_value(first + r, j);
      labels[r] = static_cast<std::int32_t>((first + r) % 3);
    }
    const auto lock = lock_hdf5();
    H5Handle handle = create_file(file);
    DatasetWriter feature_writer(handle.get(), "/features", H5T_IEEE_F32LE, {width}, rows, compress);
    feature_writer.append(features.data(), H5T_NATIVE_FLOAT, rows);
    feature_writer.close();
    DatasetWriter label_writer(handle.get(), "/labels", H5T_STD_I32LE, {}, rows, compress);
    label_writer.append(labels.data(), H5T_NATIVE_INT32, rows);
    label_writer.close();
    handle.close();
  }

  // Every rank's (sample id, features) rows of this step, gathered on every rank in rank order.
  std::vector<std::int64_t> gather_ids(const HostBatch& batch) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(global_batch), -1);
    std::vector<std::int64_t> mine(static_cast<std::size_t>(global_batch / ranks_), -1);
    std::copy(batch.sample_ids.begin(), batch.sample_ids.begin() + batch.rows, mine.begin());
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(), static_cast<int>(mine.size()),
                  MPI_INT64_T, MPI_COMM_WORLD);
    std::erase(all, -1);  // short last batches
    return all;
  }

  int rank_ = 0, ranks_ = 1;
  fs::path directory_;
  RunConfig config_;
};

TEST_F(DataLoaderMpiTest, GlobalBatchesDoNotDependOnTheRankCount) {
  config_.run.seed = 17;
  TrainingData data(config_, "data.train", std::vector<std::string>{(directory_ / "part_*.h5").string()},
                    TaskKind::classification);
  ASSERT_EQ(data.samples(), samples);
  BatchLoader loader(data, config_.data, ranks_, rank_, global_batch / ranks_, config_.run.seed);
  ASSERT_EQ(loader.steps_per_epoch(), 9);  // 204 / 24 = 8.5: the last global batch holds 12 samples
  // Two epochs, then back to the middle of the first (a resumed run).
  std::vector<LoaderPosition> positions;
  for (std::int64_t epoch = 0; epoch < 2; ++epoch)
    for (std::int64_t step = 0; step < 9; ++step) positions.push_back({epoch, step});
  positions.push_back({0, 4});
  positions.push_back({0, 5});
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const LoaderPosition position = positions[i];
    if (i > 0 && !(position == loader.position())) loader.seek(position);
    ASSERT_EQ(loader.position(), position);
    const HostBatch& batch = loader.next();
    for (std::int64_t r = 0; r < batch.rows; ++r)
      for (std::int64_t j = 0; j < width; ++j)
        ASSERT_EQ(batch.features[r * width + j], feature_value(batch.sample_ids[r], j))
            << "rank " << rank_ << " row " << r;
    std::vector<std::int64_t> global = gather_ids(batch);
    const std::vector<std::int64_t> order = torch_randperm(samples, config_.run.seed + position.epoch);
    std::vector<std::int64_t> expected(order.begin() + position.step_in_epoch * global_batch,
                                       order.begin() + std::min(samples, (position.step_in_epoch + 1) * global_batch));
    std::sort(global.begin(), global.end());
    std::sort(expected.begin(), expected.end());
    ASSERT_EQ(global, expected) << ranks_ << " ranks, epoch " << position.epoch << " step " << position.step_in_epoch;
  }
}

TEST_F(DataLoaderMpiTest, LocalShuffleReadsEverySampleOncePerEpoch) {
  config_.data.shuffle = ShuffleMode::local;
  TrainingData data(config_, "data.train",
                    std::vector<std::string>{(directory_ / "part_0.h5").string(), (directory_ / "part_1.h5").string()},
                    TaskKind::classification);
  BatchLoader loader(data, config_.data, ranks_, rank_, global_batch / ranks_, 3);
  EXPECT_EQ(data.rows_in_memory(), samples / ranks_);
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::int64_t> seen;
    const std::int64_t slice_begin = samples * rank_ / ranks_, slice_end = samples * (rank_ + 1) / ranks_;
    for (std::int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
      const HostBatch& batch = loader.next();
      for (std::int64_t r = 0; r < batch.rows; ++r) {
        ASSERT_TRUE(batch.sample_ids[r] >= slice_begin && batch.sample_ids[r] < slice_end)
            << "rank " << rank_ << " read sample " << batch.sample_ids[r] << " outside its slice";
        ASSERT_EQ(batch.features[r * width], feature_value(batch.sample_ids[r], 0));
      }
      const std::vector<std::int64_t> global = gather_ids(batch);
      seen.insert(seen.end(), global.begin(), global.end());
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(static_cast<std::int64_t>(seen.size()), samples);
    for (std::int64_t i = 0; i < samples; ++i) ASSERT_EQ(seen[i], i) << "epoch " << epoch;
  }
}

}  // namespace
}  // namespace hpctrain
