// TrainingData over several files (concatenation, globs, shape checks, transforms, memory staging) and BatchLoader's
// prefetching: the background reader gives exactly the batches of the synchronous path, also across epochs and after
// seek(), reuses its ring of buffers, and hands a reader failure to next() as the original exception.
#include "hpctrain/data/batch_loader.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

// The value of feature j of global sample s: distinct everywhere, exact in float32.
float feature_value(std::int64_t sample, std::int64_t j) { return static_cast<float>(sample * 16 + j) * 0.5f; }
std::int32_t label_value(std::int64_t sample) { return static_cast<std::int32_t>(sample % 7); }

class LoaderTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    directory_ =
        fs::temp_directory_path() / ("hpctrain-loader-" + std::string(info->name()) + "-" + std::to_string(::getpid()) +
                                     "-" + std::to_string(std::random_device{}()));
    fs::create_directories(directory_);
    config_.deck_path = "test.toml";
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(directory_, ignored);
  }
  std::string path(const std::string& name) const { return (directory_ / name).string(); }

  // A file holding global samples [first, first + rows) with features of shape sample_shape, stored as file_type.
  std::string write_part(const std::string& name, std::int64_t first, std::int64_t rows,
                         const std::vector<std::int64_t>& sample_shape = {2, 3}, bool compress = false,
                         hid_t file_type = H5T_IEEE_F32LE) {
    std::int64_t width = 1;
    for (const std::int64_t d : sample_shape) width *= d;
    std::vector<float> features(static_cast<std::size_t>(rows * width));
    std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < width; ++j) features[r * width + j] = feature_value(first + r, j);
      labels[r] = label_value(first + r);
    }
    const std::string file_path = path(name);
    const auto lock = lock_hdf5();
    H5Handle file = create_file(file_path);
    DatasetWriter feature_writer(file.get(), "/features", file_type, sample_shape, rows, compress);
    feature_writer.append(features.data(), H5T_NATIVE_FLOAT, rows);
    feature_writer.close();
    DatasetWriter label_writer(file.get(), "/labels", H5T_STD_I32LE, {}, rows, compress);
    label_writer.append(labels.data(), H5T_NATIVE_INT32, rows);
    label_writer.close();
    file.close();
    return file_path;
  }

  fs::path directory_;
  RunConfig config_;
};

// Every row of a batch is the sample its id says, transformed by `transform`.
void expect_batch_matches_ids(const HostBatch& batch, std::int64_t width, const FeatureTransform& transform = {}) {
  for (std::int64_t r = 0; r < batch.rows; ++r) {
    const std::int64_t sample = batch.sample_ids[r];
    for (std::int64_t j = 0; j < width; ++j) {
      float expected = feature_value(sample, j);
      transform.apply(&expected, 1);
      ASSERT_EQ(batch.features[r * width + j], expected) << "row " << r << " sample " << sample << " feature " << j;
    }
    ASSERT_EQ(batch.labels[r], label_value(sample)) << "row " << r;
  }
}

TEST_F(LoaderTest, SeveralFilesReadAsOneDataset) {
  const std::vector<std::string> files = {write_part("a.h5", 0, 30), write_part("b.h5", 30, 0),
                                          write_part("c.h5", 30, 50, {2, 3}, true)};
  const TrainingData data(config_, "data.train", files, TaskKind::classification);
  EXPECT_EQ(data.samples(), 80);
  EXPECT_EQ(data.feature_width(), 6);
  EXPECT_EQ(data.sample_shape(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(data.files(), files);
  HostBatch batch;
  const std::vector<std::int64_t> indices = {79, 0, 29, 30, 31, 29, 5, 79, 64};  // across files, repeats, any order
  data.read(indices.data(), static_cast<std::int64_t>(indices.size()), batch);
  ASSERT_EQ(batch.rows, 9);
  EXPECT_EQ(batch.sample_ids, indices);
  expect_batch_matches_ids(batch, 6);
}

TEST_F(LoaderTest, GlobPatternsExpandSortedAndMustMatch) {
  write_part("part_1.h5", 10, 10);
  write_part("part_0.h5", 0, 10);
  write_part("part_2.h5", 20, 5);
  const TrainingData data(config_, "data.train", std::vector<std::string>{path("part_*.h5")}, TaskKind::classification);
  EXPECT_EQ(data.files(), (std::vector<std::string>{path("part_0.h5"), path("part_1.h5"), path("part_2.h5")}));
  HostBatch batch;
  const std::vector<std::int64_t> all = {0, 9, 10, 19, 20, 24};
  data.read(all.data(), 6, batch);
  expect_batch_matches_ids(batch, 6);
  try {
    TrainingData(config_, "data.train", std::vector<std::string>{path("nothing_*.h5")}, TaskKind::classification);
    FAIL() << "no error";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("data.train: the pattern '" + path("nothing_*.h5") + "' matches no file"),
              std::string::npos)
        << error.what();
  }
}

TEST_F(LoaderTest, FilesOfOneSplitMustAgreeOnTheSampleShape) {
  const std::string a = write_part("a.h5", 0, 10, {2, 3}), b = write_part("b.h5", 10, 10, {3, 2});
  try {
    TrainingData(config_, "data.train", std::vector<std::string>{a, b}, TaskKind::classification);
    FAIL() << "no error";
  } catch (const InputError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'" + b + "' holds samples of shape (3, 2)"), std::string::npos) << message;
    EXPECT_NE(message.find("'" + a + "' holds (2, 3)"), std::string::npos) << message;
  }
}

TEST_F(LoaderTest, StoredTypesAreConvertedAndTransformsAppliedInOrder) {
  // Stored as float16 (which holds these values exactly), read as float32.
  const std::string half = path("half.h5");
  {
    const H5Handle f16 = float16_file_type();
    write_part("half.h5", 0, 4, {3}, false, f16.get());
  }
  config_.data.log1p = true;
  config_.data.scale = 2.0;
  config_.data.shift = -1.0;
  const TrainingData data(config_, "data.train", half, TaskKind::classification);
  const FeatureTransform transform = FeatureTransform::from(config_.data);
  EXPECT_FALSE(transform.is_identity());
  HostBatch batch;
  const std::vector<std::int64_t> rows = {3, 1};
  data.read(rows.data(), 2, batch);
  for (std::int64_t r = 0; r < 2; ++r)
    for (std::int64_t j = 0; j < 3; ++j)  // float16 holds these values exactly; log1p first, then * 2, then - 1
      EXPECT_FLOAT_EQ(batch.features[r * 3 + j], std::log1p(feature_value(rows[r], j)) * 2.0f - 1.0f);
}

TEST_F(LoaderTest, MemoryStagingGivesTheSameRows) {
  const std::vector<std::string> files = {write_part("a.h5", 0, 25), write_part("b.h5", 25, 25)};
  config_.data.scale = 3.0;
  for (const bool huge_pages : {false, true}) {  // data.huge_pages: the same rows
    TrainingData data(config_, "data.train", files, TaskKind::classification);
    const std::vector<std::int64_t> rows = {20, 21, 22, 40, 30, 20};
    HostBatch from_files, from_memory;
    data.read(rows.data(), 6, from_files);
    data.load_into_memory(20, 25, huge_pages);  // [20, 45): spans both files
    EXPECT_EQ(data.rows_in_memory(), 25);
    data.read(rows.data(), 6, from_memory);
    EXPECT_EQ(from_memory.features, from_files.features);
    EXPECT_EQ(from_memory.labels, from_files.labels);
    expect_batch_matches_ids(from_memory, 6, FeatureTransform::from(config_.data));
    const std::vector<std::int64_t> outside = {44, 45};  // one row not in memory: read from the files
    data.read(outside.data(), 2, from_memory);
    expect_batch_matches_ids(from_memory, 6, FeatureTransform::from(config_.data));
  }
}

struct Recorded {
  std::vector<std::int64_t> ids;
  std::vector<float> features;
  std::vector<std::int32_t> labels;
  LoaderPosition position;
  bool operator==(const Recorded&) const = default;
};

Recorded record(BatchLoader& loader, std::int64_t width) {
  Recorded recorded;
  recorded.position = loader.position();
  const HostBatch& batch = loader.next();
  recorded.ids.assign(batch.sample_ids.begin(), batch.sample_ids.end());
  recorded.features.assign(batch.features.begin(), batch.features.begin() + batch.rows * width);
  recorded.labels.assign(batch.labels.begin(), batch.labels.begin() + batch.rows);
  return recorded;
}

// 17 steps, two seeks (back into the same epoch, then ahead into a later one), 20 more steps.
std::vector<Recorded> run_script(BatchLoader& loader, std::int64_t width) {
  std::vector<Recorded> out;
  for (int i = 0; i < 17; ++i) out.push_back(record(loader, width));
  loader.seek({1, 2});
  for (int i = 0; i < 3; ++i) out.push_back(record(loader, width));
  loader.seek({4, 1});
  for (int i = 0; i < 20; ++i) out.push_back(record(loader, width));
  return out;
}

TEST_F(LoaderTest, PrefetchGivesExactlyTheSynchronousBatches) {
  // 79 samples, 2 ranks, local batch 6: 40 samples per rank (one padded), 7 steps per epoch, the last one of 4 rows.
  const std::vector<std::string> files = {write_part("a.h5", 0, 39), write_part("b.h5", 39, 40, {2, 3}, true)};
  for (const std::string shuffle : {"global", "none", "local"})
    for (const bool in_memory : {false, true})
      for (int rank = 0; rank < 2; ++rank) {
        SCOPED_TRACE("shuffle " + shuffle + ", in_memory " + std::to_string(in_memory) + ", rank " +
                     std::to_string(rank));
        config_.data.shuffle = *choice_named<ShuffleMode>(shuffle);
        config_.data.in_memory = in_memory;
        config_.data.prefetch = 0;
        TrainingData sync_data(config_, "data.train", files, TaskKind::classification);
        BatchLoader synchronous(sync_data, config_.data, 2, rank, 6, 123);
        EXPECT_EQ(synchronous.steps_per_epoch(), 7);
        const auto expected = run_script(synchronous, 6);
        for (const auto& batch : expected) {
          HostBatch check;
          check.rows = static_cast<std::int64_t>(batch.ids.size());
          check.sample_ids = batch.ids;
          check.features = batch.features;
          check.labels = batch.labels;
          expect_batch_matches_ids(check, 6);
        }
        EXPECT_EQ(expected[6].ids.size(), 4u);  // the short last batch of the epoch
        for (const std::int64_t prefetch : {1, 2, 5}) {
          config_.data.prefetch = prefetch;
          TrainingData data(config_, "data.train", files, TaskKind::classification);
          BatchLoader loader(data, config_.data, 2, rank, 6, 123);
          EXPECT_EQ(run_script(loader, 6), expected) << "prefetch " << prefetch;
        }
      }
}

TEST_F(LoaderTest, TheRingIsAllocatedOnce) {
  const std::string file = write_part("a.h5", 0, 100);
  config_.data.prefetch = 3;
  TrainingData data(config_, "data.train", file, TaskKind::classification);
  BatchLoader loader(data, config_.data, 1, 0, 8, 5);
  std::set<const float*> buffers;
  std::set<std::size_t> capacities;
  for (int step = 0; step < 60; ++step) {
    const HostBatch& batch = loader.next();
    buffers.insert(batch.features.data());
    capacities.insert(batch.sample_ids.capacity());
  }
  EXPECT_EQ(buffers.size(), 4u);  // prefetch + 1 slots, reused round the ring
  EXPECT_EQ(capacities, (std::set<std::size_t>{8}));
}

TEST_F(LoaderTest, AugmentationIsAPureFunctionOfSeedEpochAndSample) {
  // Images (2, 4, 4) with transforms and standardisation: the padding is what a raw 0 becomes.
  const std::vector<std::string> files = {write_part("a.h5", 0, 20, {2, 4, 4}), write_part("b.h5", 20, 25, {2, 4, 4})};
  config_.data.scale = 0.5;
  config_.data.shift = 1.0;
  config_.data.mean = {0.25, -2.0};
  config_.data.std = {2.0, 0.5};
  const TrainingData plain(config_, "data.train", files, TaskKind::classification);
  const std::vector<float> zero = plain.transformed_zero_per_channel();
  ASSERT_EQ(zero.size(), 2u);
  EXPECT_NEAR(zero[0], (0.5 * 0.0 + 1.0 - 0.25) / 2.0, 1e-6);
  EXPECT_NEAR(zero[1], (0.5 * 0.0 + 1.0 + 2.0) / 0.5, 1e-6);
  EXPECT_EQ(plain.augmentation(), nullptr);

  config_.data.augment_flip = true;
  config_.data.augment_crop_padding = 2;
  config_.data.augment_rot90 = true;
  const std::uint64_t seed = 77;
  const std::int64_t width = 32;
  // The reference: built here with the padding computed above in fp64, not taken from the data.
  const SampleAugmentation reference({2, 4, 4}, true, 2, true,
                                     {static_cast<float>((1.0 - 0.25) / 2.0), static_cast<float>(3.0 / 0.5)});
  for (const std::string shuffle : {"global", "local"})
    for (const bool in_memory : {false, true})
      for (const std::int64_t prefetch : {0, 2})
        for (const int ranks : {1, 2})
          for (int rank = 0; rank < ranks; ++rank) {
            SCOPED_TRACE("shuffle " + shuffle + ", in_memory " + std::to_string(in_memory) + ", prefetch " +
                         std::to_string(prefetch) + ", rank " + std::to_string(rank) + " of " + std::to_string(ranks));
            config_.data.shuffle = *choice_named<ShuffleMode>(shuffle);
            config_.data.in_memory = in_memory;
            config_.data.prefetch = prefetch;
            TrainingData data(config_, "data.train", files, TaskKind::classification);
            data.set_up_augmentation(config_);
            ASSERT_NE(data.augmentation(), nullptr);
            BatchLoader loader(data, config_.data, ranks, rank, 8 / ranks, seed);
            std::int64_t changed = 0, padded = 0;
            std::map<std::int64_t, std::vector<float>> first_epoch;
            std::int64_t differs_between_epochs = 0;
            for (int step = 0; step < 2 * loader.steps_per_epoch(); ++step) {
              const LoaderPosition position = loader.position();
              const HostBatch& batch = loader.next();
              HostBatch raw;
              plain.read(batch.sample_ids.data(), batch.rows, raw);
              for (std::int64_t r = 0; r < batch.rows; ++r) {
                const std::int64_t sample = batch.sample_ids[r];
                std::vector<float> expected(width, std::numeric_limits<float>::quiet_NaN());
                reference.apply(reference.draw(seed, position.epoch, sample), raw.features.data() + r * width,
                                expected.data());
                const std::vector<float> got(batch.features.begin() + r * width,
                                             batch.features.begin() + (r + 1) * width);
                ASSERT_EQ(got, expected) << "step " << step << " sample " << sample;
                changed += !std::equal(got.begin(), got.end(), raw.features.begin() + r * width);
                padded += std::count(got.begin(), got.begin() + 16, zero[0]) > 0;
                if (position.epoch == 0)
                  first_epoch[sample] = got;
                else if (first_epoch.count(sample))
                  differs_between_epochs += first_epoch[sample] != got;
              }
            }
            EXPECT_GT(changed, 0);
            EXPECT_GT(padded, 0);
            EXPECT_GT(differs_between_epochs, 0);
          }
}

// Overwrites the bytes of one compressed chunk of /features, so that reading it fails in the gzip filter.
void corrupt_chunk(const std::string& file, hsize_t chunk_index) {
  haddr_t address = 0;
  hsize_t size = 0;
  {
    const auto lock = lock_hdf5();
    const H5Handle handle = open_file_read_only(file);
    const H5Handle dataset = open_dataset(handle.get(), "/features");
    const H5Handle space(H5Dget_space(dataset.get()));
    hsize_t offset[3] = {};
    unsigned filter_mask = 0;
    ASSERT_GE(H5Dget_chunk_info(dataset.get(), space.get(), chunk_index, offset, &filter_mask, &address, &size), 0);
  }
  std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
  stream.seekp(static_cast<std::streamoff>(address));
  const std::string garbage(static_cast<std::size_t>(size), '\x5a');
  stream.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
}

TEST_F(LoaderTest, ReaderFailuresSurfaceAtNextWithTheirType) {
  // 1 MiB chunks hold 43690 samples of 6 floats: make the file big enough for several chunks.
  const std::int64_t rows = 120000;
  const std::string file = write_part("big.h5", 0, rows, {2, 3}, true);
  corrupt_chunk(file, 1);  // samples [43690, 87380)
  config_.data.shuffle = ShuffleMode::none;
  config_.data.prefetch = 2;
  TrainingData data(config_, "data.train", file, TaskKind::classification);
  BatchLoader loader(data, config_.data, 1, 0, 10000, 0);
  for (int step = 0; step < 4; ++step) expect_batch_matches_ids(loader.next(), 6);  // samples [0, 40000)
  for (int attempt = 0; attempt < 2; ++attempt) {  // and again: the failure stays until a seek
    try {
      loader.next();
      FAIL() << "reading a damaged chunk did not fail";
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find("reading '/features' from '" + file + "' failed"), std::string::npos)
          << error.what();
      EXPECT_EQ(error.scope(), ErrorScope::this_rank);
    }
  }
  loader.seek({0, 1});
  expect_batch_matches_ids(loader.next(), 6);
  EXPECT_EQ(loader.position(), (LoaderPosition{0, 2}));
}

}  // namespace
}  // namespace hpctrain
