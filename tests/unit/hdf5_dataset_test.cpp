// The HDF5 layer and Hdf5Dataset: handles, links, attributes, row reads in any order from every stored type and layout,
// and the messages a user sees for a missing file, a file that is not HDF5, and a missing dataset.
#include "hpctrain/data/hdf5_dataset.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "temporary_directory.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

using Hdf5DatasetTest = testing_support::TemporaryDirectoryTest;

struct Layout {
  std::vector<hsize_t> chunk;  // empty: contiguous
  int gzip_level = -1;         // < 0: no compression
  bool shuffle = false;
};

// Writes values (row-major, shape `shape`) converted from memory_type to file_type.
void write_dataset(hid_t file, const std::string& name, hid_t file_type, hid_t memory_type,
                   const std::vector<hsize_t>& shape, const void* values, const Layout& layout = {}) {
  H5Handle space(HPCTRAIN_H5_CHECK(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr)));
  H5Handle creation(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  if (!layout.chunk.empty()) {
    HPCTRAIN_H5_CHECK(H5Pset_chunk(creation.get(), static_cast<int>(layout.chunk.size()), layout.chunk.data()));
    if (layout.shuffle) HPCTRAIN_H5_CHECK(H5Pset_shuffle(creation.get()));
    if (layout.gzip_level >= 0) HPCTRAIN_H5_CHECK(H5Pset_deflate(creation.get(), layout.gzip_level));
  }
  H5Handle link_creation(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  HPCTRAIN_H5_CHECK(H5Pset_create_intermediate_group(link_creation.get(), 1));
  H5Handle dataset(HPCTRAIN_H5_CHECK(
      H5Dcreate2(file, name.c_str(), file_type, space.get(), link_creation.get(), creation.get(), H5P_DEFAULT)));
  HPCTRAIN_H5_CHECK(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values));
}

// (rows, width) values row * 10 + column + fraction: every element distinct, so a misplaced row shows.
std::vector<float> numbered_rows(std::int64_t rows, std::int64_t width, float fraction = 0.25f) {
  std::vector<float> values(static_cast<std::size_t>(rows * width));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < width; ++c)
      values[static_cast<std::size_t>(r * width + c)] = static_cast<float>(r * 10 + c) + fraction;
  return values;
}

std::vector<float> expected_rows(const std::vector<float>& all, std::int64_t width,
                                 const std::vector<std::int64_t>& indices) {
  std::vector<float> rows;
  for (std::int64_t index : indices)
    rows.insert(rows.end(), all.begin() + index * width, all.begin() + (index + 1) * width);
  return rows;
}

std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no InputError thrown";
  return "";
}

// --- handles, links, attributes ---

TEST_F(Hdf5DatasetTest, HandleClosesEveryKindOfObjectAndMoves) {
  H5Handle file = create_file(path("handles.h5"));
  const hid_t file_id = file.get();
  hid_t ids[6];
  {
    H5Handle group(HPCTRAIN_H5_CHECK(H5Gcreate2(file.get(), "/g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    H5Handle space(HPCTRAIN_H5_CHECK(H5Screate(H5S_SCALAR)));
    H5Handle type(HPCTRAIN_H5_CHECK(H5Tcopy(H5T_NATIVE_INT)));
    H5Handle properties(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    H5Handle dataset(HPCTRAIN_H5_CHECK(
        H5Dcreate2(group.get(), "d", type.get(), space.get(), H5P_DEFAULT, properties.get(), H5P_DEFAULT)));
    H5Handle attribute(
        HPCTRAIN_H5_CHECK(H5Acreate2(dataset.get(), "a", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)));
    ids[0] = group.get(), ids[1] = space.get(), ids[2] = type.get(), ids[3] = properties.get();
    ids[4] = dataset.get(), ids[5] = attribute.get();
    for (hid_t id : ids) EXPECT_GT(H5Iis_valid(id), 0);

    H5Handle moved(std::move(dataset));
    EXPECT_FALSE(dataset.valid());
    EXPECT_EQ(moved.get(), ids[4]);
    H5Handle assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.get(), ids[4]);
  }
  for (hid_t id : ids) EXPECT_LE(H5Iis_valid(id), 0);
  file.close();
  EXPECT_FALSE(file.valid());
  EXPECT_LE(H5Iis_valid(file_id), 0);
  file.close();  // closing twice is a no-op
}

TEST_F(Hdf5DatasetTest, LinkExistsWalksComponentsWithoutThrowing) {
  H5Handle file = create_file(path("links.h5"));
  const float value[1] = {1};
  write_dataset(file.get(), "/group/inner/values", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1}, value);
  write_dataset(file.get(), "/top", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1}, value);
  HPCTRAIN_H5_CHECK(H5Lcreate_soft("/nowhere", file.get(), "/dangling", H5P_DEFAULT, H5P_DEFAULT));
  EXPECT_TRUE(link_exists(file.get(), "/"));
  EXPECT_TRUE(link_exists(file.get(), "/group"));
  EXPECT_TRUE(link_exists(file.get(), "/group/inner/values"));
  EXPECT_TRUE(link_exists(file.get(), "group/inner/values"));
  EXPECT_TRUE(link_exists(file.get(), "/top"));
  EXPECT_FALSE(link_exists(file.get(), "/missing"));
  EXPECT_FALSE(link_exists(file.get(), "/missing/deeper/still"));
  EXPECT_FALSE(link_exists(file.get(), "/group/missing/values"));
  EXPECT_FALSE(link_exists(file.get(), "/top/below"));  // a dataset has no children
  EXPECT_FALSE(link_exists(file.get(), "/dangling"));
  const std::vector<std::string> datasets = list_datasets(file.get());
  EXPECT_EQ(datasets, (std::vector<std::string>{"/group/inner/values", "/top"}));
}

TEST_F(Hdf5DatasetTest, AttributesRoundTripAndReplace) {
  H5Handle file = create_file(path("attributes.h5"));
  write_string_attribute(file.get(), "kind", "spirals");
  write_integer_attribute(file.get(), "seed", 1234567890123LL);
  write_float_attribute(file.get(), "noise", 0.05);
  write_string_attribute(file.get(), "empty", "");
  EXPECT_TRUE(attribute_exists(file.get(), "kind"));
  EXPECT_FALSE(attribute_exists(file.get(), "absent"));
  EXPECT_EQ(read_string_attribute(file.get(), "kind"), "spirals");
  EXPECT_EQ(read_string_attribute(file.get(), "empty"), "");
  EXPECT_EQ(read_number_attribute(file.get(), "seed"), 1234567890123.0);
  EXPECT_EQ(read_number_attribute(file.get(), "noise"), 0.05);
  EXPECT_EQ(attribute_as_text(file.get(), "kind"), "\"spirals\"");
  EXPECT_EQ(attribute_as_text(file.get(), "seed"), "1234567890123");
  EXPECT_EQ(attribute_as_text(file.get(), "noise"), "0.05");
  write_string_attribute(file.get(), "kind", "blobs");  // replaces
  EXPECT_EQ(read_string_attribute(file.get(), "kind"), "blobs");
  std::vector<std::string> names = attribute_names(file.get());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"empty", "kind", "noise", "seed"}));
  EXPECT_THROW(read_number_attribute(file.get(), "kind"), InputError);
  EXPECT_THROW(read_string_attribute(file.get(), "seed"), InputError);
  EXPECT_THROW(read_string_attribute(file.get(), "absent"), InputError);

  // Fixed-length strings (as other tools write them) read too.
  H5Handle fixed(HPCTRAIN_H5_CHECK(H5Tcopy(H5T_C_S1)));
  HPCTRAIN_H5_CHECK(H5Tset_size(fixed.get(), 5));
  HPCTRAIN_H5_CHECK(H5Tset_strpad(fixed.get(), H5T_STR_NULLPAD));
  H5Handle scalar(HPCTRAIN_H5_CHECK(H5Screate(H5S_SCALAR)));
  H5Handle attribute(
      HPCTRAIN_H5_CHECK(H5Acreate2(file.get(), "fixed", fixed.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT)));
  HPCTRAIN_H5_CHECK(H5Awrite(attribute.get(), fixed.get(), "abc\0\0"));
  EXPECT_EQ(read_string_attribute(file.get(), "fixed"), "abc");
}

TEST_F(Hdf5DatasetTest, FailuresDoNotPrintTheHdf5ErrorStack) {
  H5Handle file = create_file(path("quiet.h5"));
  testing::internal::CaptureStderr();
  EXPECT_THROW(open_dataset(file.get(), "/nothing/here"), LibraryError);
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed, "");
  try {
    open_dataset(file.get(), "/nothing");
  } catch (const LibraryError& error) {
    EXPECT_NE(std::string(error.what()).find("H5Dopen2"), std::string::npos) << error.what();
  }
}

// --- Hdf5Dataset ---

TEST_F(Hdf5DatasetTest, ReadsRowsInAnyOrderWithRepeats) {
  const std::int64_t rows = 1000, width = 3;
  const std::vector<float> values = numbered_rows(rows, width);  // (1000, 3)
  {
    H5Handle file = create_file(path("rows.h5"));
    write_dataset(file.get(), "/features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1000, 3}, values.data());
  }
  Hdf5Dataset dataset(path("rows.h5"), "/features");
  EXPECT_EQ(dataset.samples(), rows);
  EXPECT_EQ(dataset.shape(), (std::vector<std::int64_t>{1000, 3}));
  EXPECT_EQ(dataset.sample_size(), width);
  EXPECT_EQ(dataset.type_name(), "float32");
  EXPECT_FALSE(dataset.stores_integers());

  const std::vector<std::vector<std::int64_t>> requests = {
      {5, 3, 99, 3, 0, 5, 50},    // shuffled with repeats
      {1, 2, 3, 10, 11, 12, 98},  // sorted: the direct path
      {7},                        // one row
      {42, 42, 42},               // one row, repeated
      {99, 98, 97, 96, 0},        // descending runs
  };
  for (const auto& indices : requests) {
    std::vector<float> out(indices.size() * width, -1.0f);  // (count, 3)
    dataset.read_rows(indices.data(), static_cast<std::int64_t>(indices.size()), out.data());
    EXPECT_EQ(out, expected_rows(values, width, indices));
  }

  // Many random batches through the same object, small (a few runs of rows) to large (hundreds of runs, merged).
  std::mt19937_64 random(3);
  std::uniform_int_distribution<std::int64_t> row(0, rows - 1);
  for (int batch = 0; batch < 60; ++batch) {
    std::vector<std::int64_t> indices(1 + batch * batch);
    for (auto& index : indices) index = row(random);
    std::vector<float> out(indices.size() * width);
    dataset.read_rows(indices.data(), static_cast<std::int64_t>(indices.size()), out.data());
    ASSERT_EQ(out, expected_rows(values, width, indices)) << "batch " << batch;
  }

  // Sorted with many runs (the direct path, merged selection).
  std::vector<std::int64_t> every_third(300);
  for (std::size_t i = 0; i < every_third.size(); ++i) every_third[i] = static_cast<std::int64_t>(3 * i + (i % 2));
  std::vector<float> out(every_third.size() * width);
  dataset.read_rows(every_third.data(), 300, out.data());
  EXPECT_EQ(out, expected_rows(values, width, every_third));

  std::vector<float> range(5 * width);
  dataset.read_range(995, 5, range.data());
  EXPECT_EQ(range, std::vector<float>(values.end() - 15, values.end()));
  dataset.read_range(0, 0, range.data());  // empty reads are fine
  dataset.read_rows(nullptr, 0, range.data());
}

TEST_F(Hdf5DatasetTest, RejectsRowsOutsideTheDataset) {
  const std::vector<float> values = numbered_rows(10, 2);
  {
    H5Handle file = create_file(path("bounds.h5"));
    write_dataset(file.get(), "/x", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {10, 2}, values.data());
  }
  Hdf5Dataset dataset(path("bounds.h5"), "x");  // a relative path means the same as "/x"
  EXPECT_EQ(dataset.path(), "/x");
  std::vector<float> out(4);
  const std::int64_t past_end[2] = {3, 10}, negative[2] = {-1, 0};
  EXPECT_THROW(dataset.read_rows(past_end, 2, out.data()), Error);
  EXPECT_THROW(dataset.read_rows(negative, 2, out.data()), Error);
  EXPECT_THROW(dataset.read_range(9, 2, out.data()), Error);
}

// Every stored numeric type converts to float and to int32.
TEST_F(Hdf5DatasetTest, ConvertsEveryStoredType) {
  struct StoredType {
    const char* name;
    hid_t file_type;
    bool integer;
  };
  const StoredType types[] = {
      {"uint8", H5T_STD_U8LE, true},
      {"int8", H5T_STD_I8LE, true},
      {"int16", H5T_STD_I16LE, true},
      {"uint16", H5T_STD_U16LE, true},
      {"int32", H5T_STD_I32LE, true},
      {"int64", H5T_STD_I64LE, true},
      {"float32", H5T_IEEE_F32LE, false},
      {"float64", H5T_IEEE_F64LE, false},
      {"int32 (big-endian)", H5T_STD_I32BE, true},
      {"float32 (big-endian)", H5T_IEEE_F32BE, false},
  };
  const std::int64_t rows = 40, width = 2;
  std::vector<float> values = numbered_rows(rows, width, 0.0f);  // whole numbers 0..391: exact in every type
  for (auto& value : values) value = std::fmod(value, 120.0f);   // and within int8
  const std::string file_name = path("types.h5");
  {
    H5Handle file = create_file(file_name);
    for (const StoredType& type : types)
      write_dataset(file.get(), std::string("/") + type.name, type.file_type, H5T_NATIVE_FLOAT, {40, 2}, values.data(),
                    Layout{{8, 2}});
  }
  const std::vector<std::int64_t> indices = {39, 0, 17, 17, 5, 6, 7, 1};
  const std::vector<float> expected = expected_rows(values, width, indices);
  for (const StoredType& type : types) {
    SCOPED_TRACE(type.name);
    Hdf5Dataset dataset(file_name, std::string("/") + type.name);
    EXPECT_EQ(dataset.type_name(), type.name);
    EXPECT_EQ(dataset.stores_integers(), type.integer);
    std::vector<float> as_float(indices.size() * width);
    dataset.read_rows(indices.data(), static_cast<std::int64_t>(indices.size()), as_float.data());
    EXPECT_EQ(as_float, expected);
    std::vector<std::int32_t> as_integer(indices.size() * width);
    dataset.read_rows(indices.data(), static_cast<std::int64_t>(indices.size()), as_integer.data());
    for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(as_integer[i], static_cast<std::int32_t>(expected[i]));
  }
}

// HDF5 1.10 has no predefined half type, but files from h5py/numpy store float16 as a 2-byte IEEE layout that HDF5
// converts in software: build that type by hand and check it reads.
TEST_F(Hdf5DatasetTest, ReadsFloat16AsWrittenByNumpy) {
  H5Handle half(HPCTRAIN_H5_CHECK(H5Tcopy(H5T_IEEE_F32LE)));
  HPCTRAIN_H5_CHECK(H5Tset_fields(half.get(), 15, 10, 5, 0, 10));
  HPCTRAIN_H5_CHECK(H5Tset_size(half.get(), 2));
  HPCTRAIN_H5_CHECK(H5Tset_ebias(half.get(), 15));
  const std::vector<float> values = {0.5f, -1.25f, 3.0f, 1024.0f, -0.0009765625f, 65504.0f};  // exact in fp16: (6, 1)
  {
    H5Handle file = create_file(path("half.h5"));
    write_dataset(file.get(), "/half", half.get(), H5T_NATIVE_FLOAT, {6, 1}, values.data());
  }
  Hdf5Dataset dataset(path("half.h5"), "/half");
  EXPECT_EQ(dataset.type_name(), "float16");
  const std::int64_t indices[] = {5, 0, 4, 1};
  std::vector<float> out(4);
  dataset.read_rows(indices, 4, out.data());
  EXPECT_EQ(out, (std::vector<float>{65504.0f, 0.5f, -0.0009765625f, -1.25f}));
}

TEST_F(Hdf5DatasetTest, ReadsChunkedCompressedAndMultiDimensional) {
  const std::int64_t rows = 1000, width = 12;  // stored as (1000, 3, 4)
  const std::vector<float> values = numbered_rows(rows, width);
  std::vector<std::int32_t> labels(rows);
  for (std::int64_t i = 0; i < rows; ++i) labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7) % 5);
  const std::string file_name = path("compressed.h5");
  {
    H5Handle file = create_file(file_name);
    write_dataset(file.get(), "/images", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1000, 3, 4}, values.data(),
                  Layout{{64, 3, 4}, 6, true});
    write_dataset(file.get(), "/labels", H5T_STD_U8LE, H5T_NATIVE_INT32, {1000}, labels.data(), Layout{{100}, 1});
  }
  Hdf5Dataset images(file_name, "/images");
  EXPECT_EQ(images.shape(), (std::vector<std::int64_t>{1000, 3, 4}));
  EXPECT_EQ(images.sample_size(), 12);
  Hdf5Dataset label_set(file_name, "/labels");
  EXPECT_EQ(label_set.sample_size(), 1);
  EXPECT_EQ(label_set.type_name(), "uint8");

  std::mt19937_64 random(11);
  std::vector<std::int64_t> indices(256);
  for (auto& index : indices) index = static_cast<std::int64_t>(random() % rows);
  std::vector<float> out(indices.size() * width);  // (256, 3, 4)
  images.read_rows(indices.data(), 256, out.data());
  EXPECT_EQ(out, expected_rows(values, width, indices));
  std::vector<std::int32_t> label_out(indices.size());  // (256)
  label_set.read_rows(indices.data(), 256, label_out.data());
  for (std::size_t i = 0; i < indices.size(); ++i)
    EXPECT_EQ(label_out[i], labels[static_cast<std::size_t>(indices[i])]);

  std::vector<std::int32_t> label_range(300);
  label_set.read_range(650, 300, label_range.data());
  EXPECT_TRUE(std::equal(label_range.begin(), label_range.end(), labels.begin() + 650));

  H5Handle file = open_file_read_only(file_name);
  H5Handle image_dataset = open_dataset(file.get(), "/images");
  EXPECT_EQ(storage_description(image_dataset.get()), "chunks (64, 3, 4), shuffle, gzip level 6");
}

// --- messages ---

TEST_F(Hdf5DatasetTest, MissingFileSaysSo) {
  const std::string missing = path("absent.h5");
  const std::string message = message_of([&] { Hdf5Dataset dataset(missing, "/features"); });
  EXPECT_EQ(message, "data file '" + missing + "' does not exist");
}

TEST_F(Hdf5DatasetTest, NonHdf5FileSaysSo) {
  const std::string text_file = path("notes.h5");
  std::ofstream(text_file) << "features,labels\n1,2\n";
  std::string message = message_of([&] { Hdf5Dataset dataset(text_file, "/features"); });
  EXPECT_NE(message.find("data file '" + text_file + "' is not an HDF5 file or is damaged"), std::string::npos)
      << message;

  // A real HDF5 file cut short (an interrupted copy) keeps its signature but cannot be opened.
  const std::string truncated = path("truncated.h5");
  {
    H5Handle file = create_file(truncated);
    const std::vector<float> values = numbered_rows(2000, 8);
    write_dataset(file.get(), "/features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2000, 8}, values.data());
  }
  fs::resize_file(truncated, 1000);
  message = message_of([&] { Hdf5Dataset dataset(truncated, "/features"); });
  EXPECT_NE(message.find("data file '" + truncated + "' is not an HDF5 file or is damaged"), std::string::npos)
      << message;

  message = message_of([&] { Hdf5Dataset dataset(directory_.string(), "/features"); });
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
}

TEST_F(Hdf5DatasetTest, MissingDatasetListsTheOthers) {
  const std::string file_name = path("x.h5");
  {
    H5Handle file = create_file(file_name);
    const float values[2] = {1, 2};
    write_dataset(file.get(), "/features", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2}, values);
    write_dataset(file.get(), "/targets", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2}, values);
    write_dataset(file.get(), "/extra/more", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2}, values);
    H5Handle scalar(HPCTRAIN_H5_CHECK(H5Screate(H5S_SCALAR)));
    H5Handle single(HPCTRAIN_H5_CHECK(
        H5Dcreate2(file.get(), "/single", H5T_IEEE_F32LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    H5Handle string_type(HPCTRAIN_H5_CHECK(H5Tcopy(H5T_C_S1)));
    HPCTRAIN_H5_CHECK(H5Tset_size(string_type.get(), 8));
    H5Handle vector_space(HPCTRAIN_H5_CHECK(H5Screate_simple(1, std::vector<hsize_t>{2}.data(), nullptr)));
    H5Handle names(HPCTRAIN_H5_CHECK(H5Dcreate2(file.get(), "/names", string_type.get(), vector_space.get(),
                                                H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  }
  EXPECT_EQ(
      message_of([&] { Hdf5Dataset dataset(file_name, "/labels"); }),
      "dataset '/labels' not found in '" + file_name + "'; it has: /extra/more, /features, /names, /single, /targets");
  std::string message = message_of([&] { Hdf5Dataset dataset(file_name, "/labels/deeper"); });
  EXPECT_NE(message.find("dataset '/labels/deeper' not found in '" + file_name + "'"), std::string::npos) << message;
  message = message_of([&] { Hdf5Dataset dataset(file_name, "/extra"); });
  EXPECT_NE(message.find("'/extra' in '" + file_name + "' is a group, not a dataset"), std::string::npos) << message;
  message = message_of([&] { Hdf5Dataset dataset(file_name, "/single"); });
  EXPECT_NE(message.find("is a single value"), std::string::npos) << message;
  message = message_of([&] { Hdf5Dataset dataset(file_name, "/names"); });
  EXPECT_NE(message.find("holds string values"), std::string::npos) << message;

  const std::string empty_file = path("empty.h5");
  { H5Handle file = create_file(empty_file); }
  EXPECT_EQ(message_of([&] { Hdf5Dataset dataset(empty_file, "/features"); }),
            "dataset '/features' not found in '" + empty_file + "'; it has no datasets");
}

}  // namespace
}  // namespace hpctrain
