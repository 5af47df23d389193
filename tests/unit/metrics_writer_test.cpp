// MetricsWriter: tables of extendible columns, rounding of integer columns, nested groups, attributes, and the promise
// that every appended row is on disk, readable without repair, even when the writer never closes the file.
#include "hpctrain/io/metrics_writer.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "temporary_directory.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

using MetricsWriterTest = testing_support::TemporaryDirectoryTest;

// A whole 1-D column, read back with plain HDF5 calls (not through the writer).
template <class T>
std::vector<T> read_column(const std::string& file_name, const std::string& column, hid_t memory_type,
                           std::string* stored_type = nullptr, hsize_t* max_rows = nullptr) {
  H5Handle file = open_file_read_only(file_name);
  H5Handle dataset = open_dataset(file.get(), column);
  H5Handle space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset.get())));
  EXPECT_EQ(H5Sget_simple_extent_ndims(space.get()), 1);
  hsize_t rows = 0, max = 0;
  HPCTRAIN_H5_CHECK(H5Sget_simple_extent_dims(space.get(), &rows, &max));
  if (max_rows != nullptr) *max_rows = max;
  if (stored_type != nullptr) {
    H5Handle type(HPCTRAIN_H5_CHECK(H5Dget_type(dataset.get())));
    *stored_type = type_name(type.get());
  }
  std::vector<T> values(rows);
  if (rows > 0) HPCTRAIN_H5_CHECK(H5Dread(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
  return values;
}

TEST_F(MetricsWriterTest, AppendsRowsAndReadsBack) {
  const std::string file_name = path("metrics.h5");
  {
    MetricsWriter writer(file_name);
    writer.define("train", {{"step", MetricKind::int64}, {"loss", MetricKind::float64}, {"lr", MetricKind::float64}});
    EXPECT_EQ(writer.rows("train"), 0);
    writer.append("train", {1, 2.5, 1e-3});
    writer.append("train", {2.4, 2.25, 2e-3});  // 2.4 rounds to 2
    writer.append("train", {2.6, 2.0, 3e-3});   // 2.6 rounds to 3
    writer.append("train", {-7.5, std::numeric_limits<double>::quiet_NaN(), 0});
    EXPECT_EQ(writer.rows("train"), 4);
    writer.set_attribute("deck", "default.toml");
    writer.close();
  }
  std::string stored;
  hsize_t max_rows = 0;
  EXPECT_EQ(read_column<std::int64_t>(file_name, "/train/step", H5T_NATIVE_INT64, &stored, &max_rows),
            (std::vector<std::int64_t>{1, 2, 3, -8}));
  EXPECT_EQ(stored, "int64");
  EXPECT_EQ(max_rows, H5S_UNLIMITED);
  const std::vector<double> loss = read_column<double>(file_name, "/train/loss", H5T_NATIVE_DOUBLE, &stored);
  EXPECT_EQ(stored, "float64");
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_EQ(loss[0], 2.5);
  EXPECT_EQ(loss[2], 2.0);
  EXPECT_TRUE(std::isnan(loss[3]));
  EXPECT_EQ(read_column<double>(file_name, "/train/lr", H5T_NATIVE_DOUBLE), (std::vector<double>{1e-3, 2e-3, 3e-3, 0}));
  H5Handle file = open_file_read_only(file_name);
  EXPECT_EQ(read_string_attribute(file.get(), "deck"), "default.toml");
}

TEST_F(MetricsWriterTest, ColumnsGrowPastManyChunks) {
  const std::string file_name = path("long.h5");
  const int rows = 3000;  // about three chunks
  {
    MetricsWriter writer(file_name);
    writer.define("train", {{"step", MetricKind::int64}, {"loss", MetricKind::float64}});
    for (int i = 0; i < rows; ++i) writer.append("train", {static_cast<double>(i), 1.0 / (1 + i)});
  }
  const auto steps = read_column<std::int64_t>(file_name, "/train/step", H5T_NATIVE_INT64);
  const auto loss = read_column<double>(file_name, "/train/loss", H5T_NATIVE_DOUBLE);
  ASSERT_EQ(steps.size(), static_cast<std::size_t>(rows));
  ASSERT_EQ(loss.size(), static_cast<std::size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    ASSERT_EQ(steps[static_cast<std::size_t>(i)], i);
    ASSERT_EQ(loss[static_cast<std::size_t>(i)], 1.0 / (1 + i));
  }
}

TEST_F(MetricsWriterTest, SeveralAndNestedGroupsKeepTheirOwnRows) {
  const std::string file_name = path("groups.h5");
  {
    MetricsWriter writer(file_name);
    writer.define("eval/validation", {{"step", MetricKind::int64}, {"accuracy", MetricKind::float64}});
    writer.define("eval", {{"step", MetricKind::int64}});  // the parent, created implicitly above, is fine
    writer.define("train", {{"step", MetricKind::int64}});
    writer.append("train", {1});
    writer.append("train", {2});
    writer.append("eval/validation", {2, 0.5});
    EXPECT_EQ(writer.rows("train"), 2);
    EXPECT_EQ(writer.rows("eval/validation"), 1);
    EXPECT_EQ(writer.rows("eval"), 0);
  }
  EXPECT_EQ(read_column<std::int64_t>(file_name, "/train/step", H5T_NATIVE_INT64).size(), 2u);
  EXPECT_EQ(read_column<double>(file_name, "/eval/validation/accuracy", H5T_NATIVE_DOUBLE), std::vector<double>{0.5});
  EXPECT_TRUE(read_column<std::int64_t>(file_name, "/eval/step", H5T_NATIVE_INT64).empty());
}

TEST_F(MetricsWriterTest, MisuseIsAnInternalError) {
  MetricsWriter writer(path("misuse.h5"));
  writer.define("train", {{"step", MetricKind::int64}, {"loss", MetricKind::float64}});
  EXPECT_THROW(writer.append("nothing", {1, 2}), Error);
  EXPECT_THROW(writer.append("train", {1}), Error);
  EXPECT_THROW(writer.append("train", {std::numeric_limits<double>::infinity(), 1}), Error);
  EXPECT_THROW(writer.define("train", {{"x", MetricKind::int64}}), Error);
  EXPECT_THROW(writer.define("other", {{"x", MetricKind::int64}, {"x", MetricKind::float64}}), Error);
  EXPECT_THROW(writer.define("empty", {}), Error);
  EXPECT_EQ(writer.rows("train"), 0);
}

TEST_F(MetricsWriterTest, ExistingFileIsReplaced) {
  const std::string file_name = path("again.h5");
  {
    MetricsWriter writer(file_name);
    writer.define("old", {{"x", MetricKind::float64}});
  }
  {
    MetricsWriter writer(file_name);
    writer.define("new", {{"x", MetricKind::float64}});
  }
  H5Handle file = open_file_read_only(file_name);
  EXPECT_FALSE(link_exists(file.get(), "/old"));
  EXPECT_TRUE(link_exists(file.get(), "/new/x"));
}

// What a crash leaves on disk: a copy of the file taken while the writer still has it open holds every appended row.
TEST_F(MetricsWriterTest, FlushedRowsAreOnDiskWhileTheWriterIsOpen) {
  const std::string file_name = path("live.h5"), snapshot = path("snapshot.h5");
  MetricsWriter writer(file_name);
  writer.define("train", {{"step", MetricKind::int64}, {"loss", MetricKind::float64}});
  for (int i = 0; i < 5; ++i) writer.append("train", {static_cast<double>(i), 0.5 * i});
  fs::copy_file(file_name, snapshot);
  EXPECT_EQ(read_column<std::int64_t>(snapshot, "/train/step", H5T_NATIVE_INT64),
            (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(read_column<double>(snapshot, "/train/loss", H5T_NATIVE_DOUBLE),
            (std::vector<double>{0, 0.5, 1.0, 1.5, 2.0}));
}

// A process that dies without closing the file (no destructors, no atexit handlers: _exit) leaves a readable file.
TEST_F(MetricsWriterTest, RowsSurviveAWriterThatNeverCloses) {
  const std::string file_name = path("crashed.h5");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 0;
    try {
      auto* writer = new MetricsWriter(file_name);  // deliberately never deleted: the file is never closed
      writer->define("train", {{"step", MetricKind::int64}, {"loss", MetricKind::float64}});
      for (int i = 0; i < 3; ++i) writer->append("train", {10.0 * i, 1.0 / (1 + i)});
      writer->set_attribute("status", "running");
    } catch (...) {
      status = 3;
    }
    ::_exit(status);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child could not write the file";
  EXPECT_EQ(read_column<std::int64_t>(file_name, "/train/step", H5T_NATIVE_INT64),
            (std::vector<std::int64_t>{0, 10, 20}));
  EXPECT_EQ(read_column<double>(file_name, "/train/loss", H5T_NATIVE_DOUBLE), (std::vector<double>{1.0, 0.5, 1.0 / 3}));
  H5Handle file = open_file_read_only(file_name);
  EXPECT_EQ(read_string_attribute(file.get(), "status"), "running");
}

// A training run reads batches on the loader's thread while the main thread appends metrics; HDF5 is not built
// thread-safe here, so this only works because both sides take lock_hdf5().
TEST_F(MetricsWriterTest, AppendsWhileAnotherThreadReadsData) {
  const std::string data_name = path("data.h5");
  const std::int64_t rows = 4096, width = 8;
  std::vector<float> values(static_cast<std::size_t>(rows * width));  // (4096, 8)
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  {
    H5Handle file = create_file(data_name);
    const hsize_t shape[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(width)}, chunk[2] = {256, 8};
    H5Handle space(HPCTRAIN_H5_CHECK(H5Screate_simple(2, shape, nullptr)));
    H5Handle creation(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    HPCTRAIN_H5_CHECK(H5Pset_chunk(creation.get(), 2, chunk));
    HPCTRAIN_H5_CHECK(H5Pset_deflate(creation.get(), 1));
    H5Handle dataset(HPCTRAIN_H5_CHECK(
        H5Dcreate2(file.get(), "/features", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, creation.get(), H5P_DEFAULT)));
    HPCTRAIN_H5_CHECK(H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
  }

  int bad_batches = 0;
  std::thread loader([&] {
    Hdf5Dataset features(data_name, "/features");
    std::mt19937_64 random(5);
    std::vector<std::int64_t> indices(64);
    std::vector<float> batch(64 * width);  // (64, 8)
    for (int step = 0; step < 400; ++step) {
      for (auto& index : indices) index = static_cast<std::int64_t>(random() % rows);
      features.read_rows(indices.data(), 64, batch.data());
      for (std::size_t i = 0; i < indices.size(); ++i)
        if (batch[i * width] != values[static_cast<std::size_t>(indices[i] * width)]) ++bad_batches;
    }
  });
  const std::string metrics_name = path("metrics.h5");
  {
    MetricsWriter writer(metrics_name);
    writer.define("train", {{"step", MetricKind::int64}, {"loss", MetricKind::float64}});
    for (int step = 0; step < 400; ++step) writer.append("train", {static_cast<double>(step), 1.0});
  }
  loader.join();
  EXPECT_EQ(bad_batches, 0);
  EXPECT_EQ(read_column<std::int64_t>(metrics_name, "/train/step", H5T_NATIVE_INT64).size(), 400u);
}

}  // namespace
}  // namespace hpctrain
