// Token data (data/tokens.hpp) read by the loader on 1, 2 and 4 ranks: sample i is the window of T + 1 tokens from
// token i x T of its file (windows never cross files), every row's input and targets are that window, the global
// batches at every step are the windows torch.randperm puts there whatever the rank count, each rank's rows are the
// ones its DistributedSampler gives it (with data.shuffle = "local", only its own slice, staged in memory), and the
// id check finds the first id outside the vocabulary, which every rank reports alike.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/batch_loader.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/data/distributed_sampler.hpp"
#include "hpctrain/data/tokens.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t length = 16, global_batch = 24, vocabulary = 65536;
constexpr std::int64_t file_tokens[2] = {1000, 550};  // 999 / 16 = 62 and 549 / 16 = 34 windows
constexpr std::int64_t first_file_windows = 62, windows = 96;

std::int32_t token_at(int file, std::int64_t position) {
  return static_cast<std::int32_t>((position * 37 + 1000 * file) % 65521);
}

class TokenDataMpiTest : public testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    char name[256] = {};
    if (rank_ == 0) {
      const fs::path directory = fs::temp_directory_path() / ("hpctrain-mpi-tokens-" + std::to_string(::getpid()) +
                                                              "-" + std::to_string(std::random_device{}()));
      fs::create_directories(directory);
      std::snprintf(name, sizeof name, "%s", directory.c_str());
      for (int file = 0; file < 2; ++file) {
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(file_tokens[file]));
        for (std::int64_t p = 0; p < file_tokens[file]; ++p) tokens[static_cast<std::size_t>(p)] = token_at(file, p);
        write_tokens((directory / ("part_" + std::to_string(file) + ".h5")).string(), tokens, H5T_STD_U16LE, vocabulary,
                     file == 0 ? length : 0);
      }
      std::vector<std::int32_t> bad(800, 3);
      bad[700] = 1234;
      write_tokens((directory / "bad.h5").string(), bad, H5T_STD_I32LE, 1000, length);
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

  static void write_tokens(const std::string& file, const std::vector<std::int32_t>& tokens, hid_t type,
                           std::int64_t vocabulary_size, std::int64_t sequence_length) {
    const auto lock = lock_hdf5();
    H5Handle handle = create_file(file);
    DatasetWriter writer(handle.get(), tokens_dataset, type, {}, static_cast<std::int64_t>(tokens.size()), false);
    writer.append(tokens.data(), H5T_NATIVE_INT32, static_cast<std::int64_t>(tokens.size()));
    writer.close();
    write_integer_attribute(handle.get(), vocabulary_attribute, vocabulary_size);
    if (sequence_length > 0) write_integer_attribute(handle.get(), sequence_length_attribute, sequence_length);
    handle.close();
  }

  std::vector<std::string> parts() const {
    return {(directory_ / "part_0.h5").string(), (directory_ / "part_1.h5").string()};
  }

  // Every row's input is the first T tokens of its window and its targets the last T.
  static void expect_windows(const HostBatch& batch) {
    for (std::int64_t r = 0; r < batch.rows; ++r) {
      const std::int64_t sample = batch.sample_ids[static_cast<std::size_t>(r)];
      const int file = sample < first_file_windows ? 0 : 1;
      const std::int64_t start = (sample - (file == 0 ? 0 : first_file_windows)) * length;
      for (std::int64_t t = 0; t < length; ++t) {
        ASSERT_EQ(batch.tokens[static_cast<std::size_t>(r * length + t)], token_at(file, start + t))
            << "sample " << sample << " position " << t;
        ASSERT_EQ(batch.token_targets[static_cast<std::size_t>(r * length + t)], token_at(file, start + t + 1))
            << "sample " << sample << " position " << t;
      }
    }
  }

  // Every rank's sample ids of this step, gathered on every rank.
  std::vector<std::int64_t> gather_ids(const HostBatch& batch) const {
    std::vector<std::int64_t> all(static_cast<std::size_t>(global_batch), -1);
    std::vector<std::int64_t> mine(static_cast<std::size_t>(global_batch / ranks_), -1);
    std::copy(batch.sample_ids.begin(), batch.sample_ids.begin() + batch.rows, mine.begin());
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(), static_cast<int>(mine.size()),
                  MPI_INT64_T, MPI_COMM_WORLD);
    std::erase(all, -1);
    return all;
  }

  int rank_ = 0, ranks_ = 1;
  fs::path directory_;
  RunConfig config_;
};

TEST_F(TokenDataMpiTest, WindowsAreSamplesWhateverTheRankCount) {
  config_.run.seed = 5;
  TrainingData data(config_, "data.train", parts(), TaskKind::classification);
  ASSERT_TRUE(data.holds_tokens());
  EXPECT_EQ(data.samples(), windows);
  EXPECT_EQ(data.sequence_length(), length);  // from the first file's attribute
  EXPECT_EQ(data.vocabulary(), vocabulary);
  EXPECT_EQ(data.model_input_shape(), std::vector<std::int64_t>{length});
  EXPECT_NO_THROW(data.validate_tokens(MPI_COMM_WORLD));
  BatchLoader loader(data, config_.data, ranks_, rank_, global_batch / ranks_, config_.run.seed);
  ASSERT_EQ(loader.steps_per_epoch(), 4);  // 96 / 24
  const DistributedSampler sampler(windows, ranks_, rank_, config_.run.seed, true, false);
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<std::int64_t> own = sampler.indices(epoch);
    for (std::int64_t step = 0; step < 4; ++step) {
      const HostBatch& batch = loader.next();
      expect_windows(batch);
      // this rank's rows: exactly its sampler's indices for this step
      const std::vector<std::int64_t> mine(batch.sample_ids.begin(), batch.sample_ids.begin() + batch.rows);
      const std::vector<std::int64_t> expected_mine(
          own.begin() + std::min<std::int64_t>(step * (global_batch / ranks_), static_cast<std::int64_t>(own.size())),
          own.begin() +
              std::min<std::int64_t>((step + 1) * (global_batch / ranks_), static_cast<std::int64_t>(own.size())));
      EXPECT_EQ(mine, expected_mine) << "rank " << rank_ << " epoch " << epoch << " step " << step;
      std::vector<std::int64_t> global = gather_ids(batch);
      const std::vector<std::int64_t> order = torch_randperm(windows, config_.run.seed + epoch);
      std::vector<std::int64_t> expected(order.begin() + step * global_batch,
                                         order.begin() + std::min(windows, (step + 1) * global_batch));
      std::sort(global.begin(), global.end());
      std::sort(expected.begin(), expected.end());
      ASSERT_EQ(global, expected) << ranks_ << " ranks, epoch " << epoch << " step " << step;
    }
  }
}

TEST_F(TokenDataMpiTest, LocalShuffleStagesAndReadsOnlyTheRanksSlice) {
  config_.data.shuffle = ShuffleMode::local;
  TrainingData data(config_, "data.train", parts(), TaskKind::classification);
  BatchLoader loader(data, config_.data, ranks_, rank_, global_batch / ranks_, 3);
  const std::int64_t slice_begin = windows * rank_ / ranks_, slice_end = windows * (rank_ + 1) / ranks_;
  EXPECT_EQ(data.rows_in_memory(), slice_end - slice_begin);
  std::vector<std::int64_t> seen;
  for (std::int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
    const HostBatch& batch = loader.next();
    expect_windows(batch);
    for (std::int64_t r = 0; r < batch.rows; ++r)
      ASSERT_TRUE(batch.sample_ids[r] >= slice_begin && batch.sample_ids[r] < slice_end)
          << "rank " << rank_ << " read window " << batch.sample_ids[r] << " outside its slice";
    const std::vector<std::int64_t> global = gather_ids(batch);
    seen.insert(seen.end(), global.begin(), global.end());
  }
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(static_cast<std::int64_t>(seen.size()), windows);  // every window once per epoch
}

TEST_F(TokenDataMpiTest, TheDecksSequenceLengthWinsAndOneIsNeeded) {
  config_.data.sequence_length = 100;  // 999 / 100 + 549 / 100 = 9 + 5 windows
  const TrainingData data(config_, "data.train", parts(), TaskKind::classification);
  EXPECT_EQ(data.samples(), 14);
  config_.data.sequence_length = 0;
  try {
    const TrainingData no_length(config_, "data.train", std::vector<std::string>{parts()[1]}, TaskKind::classification);
    FAIL() << "a token file without sequence_length and no data.sequence_length was accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("data.sequence_length is not set"), std::string::npos) << error.what();
  }
  config_.data.scale = 2.0;
  EXPECT_THROW(TrainingData(config_, "data.train", parts(), TaskKind::classification), InputError);
}

TEST_F(TokenDataMpiTest, EveryRankReportsTheFirstIdOutsideTheVocabulary) {
  const TrainingData data(config_, "data.train", (directory_ / "bad.h5").string(), TaskKind::classification);
  try {
    data.validate_tokens(MPI_COMM_WORLD);
    FAIL() << "id 1234 in a vocabulary of 1000 was accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("token id 1234 at position 700 of /tokens"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("outside [0, 1000)"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace hpctrain
