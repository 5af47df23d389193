// Hdf5Dataset's direct (memory-mapped) read path against HDF5's own: for every stored type and layout the direct path
// takes (rows of 4 x 3 values, and rows of one value as labels are), both give identical values (random rows with
// repeats, ranges across chunks, int32 saturation); layouts it must not take (compressed chunks, chunks that split a
// sample, big-endian values, unwritten chunks) fall back to HDF5.
// A file that shrinks under the memory map is an error for every read it can change, never zeros or a bus error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>

#include "hpctrain/core/error.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

struct Layout {
  std::vector<hsize_t> chunk;  // empty: contiguous
  bool compress = false;
  bool one_value_rows = false;  // (rows) instead of (rows, 4, 3): labels' shape
  [[nodiscard]] std::int64_t values_per_row() const { return one_value_rows ? 1 : 12; }
};

// (rows, 4, 3) values (or (rows)) of `file_type` in a new file, from doubles; `write_rows` < rows leaves the tail
// unwritten.
void write_values(const std::string& file, hid_t file_type, const Layout& layout, std::int64_t rows,
                  const std::vector<double>& values, std::int64_t write_rows = -1) {
  const auto lock = lock_hdf5();
  H5Handle handle = create_file(file);
  const int rank = layout.one_value_rows ? 1 : 3;
  const hsize_t dims[3] = {static_cast<hsize_t>(rows), 4, 3};
  H5Handle space(H5Screate_simple(rank, dims, nullptr));
  H5Handle creation(H5Pcreate(H5P_DATASET_CREATE));
  if (!layout.chunk.empty()) {
    H5Pset_chunk(creation.get(), rank, layout.chunk.data());
    if (layout.compress) H5Pset_deflate(creation.get(), 1);
  }
  H5Handle dataset(H5Dcreate2(handle.get(), "/x", file_type, space.get(), H5P_DEFAULT, creation.get(), H5P_DEFAULT));
  const hsize_t start[3] = {0, 0, 0};
  const hsize_t count[3] = {static_cast<hsize_t>(write_rows < 0 ? rows : write_rows), 4, 3};
  H5Handle file_space(H5Dget_space(dataset.get()));
  H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  H5Handle memory_space(H5Screate_simple(rank, count, nullptr));
  ASSERT_GE(
      H5Dwrite(dataset.get(), H5T_NATIVE_DOUBLE, memory_space.get(), file_space.get(), H5P_DEFAULT, values.data()), 0);
  handle.close();
}

// Reads with the direct path allowed or not (HPCTRAIN_HDF5_DIRECT=0 sends everything through HDF5).
std::unique_ptr<Hdf5Dataset> open_with(const std::string& file, bool direct) {
  if (direct) {
    unsetenv("HPCTRAIN_HDF5_DIRECT");
  } else {
    setenv("HPCTRAIN_HDF5_DIRECT", "0", 1);
  }
  auto dataset = std::make_unique<Hdf5Dataset>(file, "/x");
  unsetenv("HPCTRAIN_HDF5_DIRECT");
  return dataset;
}

class DirectReadTest : public testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() /
                 ("hpctrain-direct-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(directory_, ignored);
  }
  std::string path(const std::string& name) const { return (directory_ / name).string(); }
  fs::path directory_;
};

// Values that every type holds exactly where it can, plus extremes that saturate on the way to int32.
std::vector<double> values_for(hid_t type, std::int64_t rows) {
  const H5T_class_t type_class = H5Tget_class(type);
  const bool is_signed = type_class == H5T_FLOAT || H5Tget_sign(type) == H5T_SGN_2;
  const std::size_t bytes = H5Tget_size(type);
  std::vector<double> values(static_cast<std::size_t>(rows * 12));
  for (std::size_t i = 0; i < values.size(); ++i) {
    double v = static_cast<double>(i % 97) * (type_class == H5T_FLOAT ? 0.25 : 1.0);
    if (is_signed && i % 3 == 1) v = -v;
    values[i] = v;
  }
  if (type_class == H5T_INTEGER && bytes == 8) {  // beyond int32 both ways: HDF5 saturates, so must we
    values[5] = is_signed ? -9.0e15 : 9.0e15;
    values[6] = 5.0e9;
  }
  if (type_class == H5T_INTEGER && bytes == 4 && !is_signed) values[7] = 4.0e9;
  return values;
}

TEST_F(DirectReadTest, SameValuesAsHdf5ForEveryTypeAndLayout) {
  const std::int64_t rows = 50;
  const H5Handle half = float16_file_type();
  const std::vector<std::pair<const char*, hid_t>> types = {
      {"uint8", H5T_STD_U8LE},   {"int8", H5T_STD_I8LE},      {"uint16", H5T_STD_U16LE},  {"int16", H5T_STD_I16LE},
      {"uint32", H5T_STD_U32LE}, {"int32", H5T_STD_I32LE},    {"uint64", H5T_STD_U64LE},  {"int64", H5T_STD_I64LE},
      {"float16", half.get()},   {"float32", H5T_IEEE_F32LE}, {"float64", H5T_IEEE_F64LE}};
  const std::vector<std::pair<const char*, Layout>> layouts = {
      {"contiguous", {}},
      {"chunks of 7 rows", {{7, 4, 3}}},
      {"chunks of 8 rows", {{8, 4, 3}}},  // 2^k: no division
      {"chunks of 1 row", {{1, 4, 3}}},
      {"two chunks of 32 rows", {{32, 4, 3}}},
      {"one chunk", {{50, 4, 3}}},
      {"one value per row", {{}, false, true}},
      {"one value per row, chunks of 7", {{7}, false, true}},
      {"one value per row, chunks of 16", {{16}, false, true}}};
  std::vector<std::int64_t> indices = {49, 0, 6, 7, 8, 9, 13, 14, 14, 3, 48, 27, 28, 29, 30, 2};
  for (const auto& [type_name, type] : types)
    for (const auto& [layout_name, layout] : layouts) {
      SCOPED_TRACE(std::string(type_name) + ", " + layout_name);
      const std::size_t width = static_cast<std::size_t>(layout.values_per_row());
      const std::string file = path(std::string(type_name) + "-" + layout_name + ".h5");
      write_values(file, type, layout, rows, values_for(type, rows));
      const auto direct = open_with(file, true), through_hdf5 = open_with(file, false);
      ASSERT_TRUE(direct->reads_directly());
      ASSERT_FALSE(through_hdf5->reads_directly());
      std::vector<float> a(indices.size() * width), b(a.size());
      direct->read_rows(indices.data(), static_cast<std::int64_t>(indices.size()), a.data());
      through_hdf5->read_rows(indices.data(), static_cast<std::int64_t>(indices.size()), b.data());
      EXPECT_EQ(a, b);
      std::vector<float> range_a(30 * width), range_b(range_a.size());
      direct->read_range(5, 30, range_a.data());
      through_hdf5->read_range(5, 30, range_b.data());
      EXPECT_EQ(range_a, range_b);
      std::vector<std::int32_t> ints_a(indices.size() * width), ints_b(ints_a.size());
      direct->read_rows(indices.data(), static_cast<std::int64_t>(indices.size()), ints_a.data());
      through_hdf5->read_rows(indices.data(), static_cast<std::int64_t>(indices.size()), ints_b.data());
      EXPECT_EQ(ints_a, ints_b);
      std::vector<double> doubles_a(50 * width), doubles_b(doubles_a.size());
      direct->read_range(0, 50, doubles_a.data());
      through_hdf5->read_range(0, 50, doubles_b.data());
      EXPECT_EQ(doubles_a, doubles_b);
      std::vector<unsigned char> raw_a(indices.size() * width * direct->stored_value_bytes()), raw_b(raw_a.size());
      direct->read_rows_stored(indices.data(), static_cast<std::int64_t>(indices.size()), raw_a.data());
      through_hdf5->read_rows_stored(indices.data(), static_cast<std::int64_t>(indices.size()), raw_b.data());
      EXPECT_EQ(raw_a, raw_b);
    }
}

// Chunks on 4 KiB boundaries (H5Pset_alignment, as `h5repack -a 4096` writes them) and rows of 4 KiB, read into a
// buffer 16 bytes past a page: every row copy has its destination 16 bytes past its source modulo 4 KiB, the case
// copy_bytes sends to its own vector moves. The values are those HDF5 reads, row for row.
TEST_F(DirectReadTest, PageAlignedChunksIntoABufferPastAPage) {
  constexpr std::int64_t rows = 40, width = 1024, chunk_rows = 8;
  const std::string file = path("aligned.h5");
  std::vector<float> values(static_cast<std::size_t>(rows * width));
  std::mt19937 generator(5);
  std::normal_distribution<float> normal;
  for (float& value : values) value = normal(generator);
  {
    const auto lock = lock_hdf5();
    const H5Handle access(H5Pcreate(H5P_FILE_ACCESS));
    ASSERT_GE(H5Pset_alignment(access.get(), 1, 4096), 0);
    const H5Handle handle(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()));
    const hsize_t dims[2] = {rows, width}, chunk[2] = {chunk_rows, width};
    const H5Handle space(H5Screate_simple(2, dims, nullptr));
    const H5Handle creation(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_chunk(creation.get(), 2, chunk);
    const H5Handle dataset(
        H5Dcreate2(handle.get(), "/x", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, creation.get(), H5P_DEFAULT));
    ASSERT_GE(H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    for (hsize_t c = 0; c < rows / chunk_rows; ++c) {  // the layout this test is about
      const hsize_t offset[2] = {c * chunk_rows, 0};
      haddr_t address = HADDR_UNDEF;
      ASSERT_GE(H5Dget_chunk_info_by_coord(dataset.get(), offset, nullptr, &address, nullptr), 0);
      ASSERT_EQ(address % 4096, 0u) << "chunk " << c;
    }
  }
  const auto direct = open_with(file, true), through_hdf5 = open_with(file, false);
  ASSERT_TRUE(direct->reads_directly());
  // Runs of consecutive rows (one copy each, up to a chunk's end), single rows, repeats.
  const std::vector<std::int64_t> indices = {3, 4, 5, 6, 7, 8, 9, 39, 0, 17, 17, 24, 25, 26, 27, 28, 29, 30, 31, 12};
  const auto count = static_cast<std::int64_t>(indices.size());
  std::vector<float> storage(static_cast<std::size_t>((count + 2) * width));
  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
  float* const out = storage.data() + ((4096 + 16 - address % 4096) % 4096) / sizeof(float);  // 16 bytes past a page
  std::fill(storage.begin(), storage.end(), std::numeric_limits<float>::quiet_NaN());
  direct->read_rows(indices.data(), count, out);
  std::vector<float> expected(static_cast<std::size_t>(count * width));
  through_hdf5->read_rows(indices.data(), count, expected.data());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), out));
  for (std::int64_t i = 0; i < count; ++i)  // and HDF5 read what was written
    ASSERT_EQ(expected[static_cast<std::size_t>(i * width + width - 1)],
              values[static_cast<std::size_t>(indices[static_cast<std::size_t>(i)] * width + width - 1)]);
  std::fill(storage.begin(), storage.end(), std::numeric_limits<float>::quiet_NaN());
  direct->read_range(8, 16, out);  // two whole chunks
  EXPECT_TRUE(std::equal(values.begin() + 8 * width, values.begin() + 24 * width, out));
}

TEST_F(DirectReadTest, LayoutsTheDirectPathLeavesToHdf5) {
  const std::int64_t rows = 20;
  const std::vector<double> values = values_for(H5T_IEEE_F32LE, rows);
  struct Case {
    const char* name;
    hid_t type;
    Layout layout;
    std::int64_t written;
  };
  const std::vector<Case> cases = {
      {"compressed", H5T_IEEE_F32LE, {{5, 4, 3}, true}, -1},
      {"chunks split a sample", H5T_IEEE_F32LE, {{5, 2, 3}}, -1},
      {"big-endian", H5T_IEEE_F32BE, {}, -1},
      {"unwritten chunks", H5T_IEEE_F32LE, {{5, 4, 3}}, 8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string file = path(std::string(c.name) + ".h5");
    write_values(file, c.type, c.layout, rows, values, c.written);
    const auto dataset = open_with(file, true);
    EXPECT_FALSE(dataset->reads_directly());
    std::vector<float> read(static_cast<std::size_t>(rows * 12));
    dataset->read_range(0, rows, read.data());
    const std::int64_t written = c.written < 0 ? rows : c.written;
    for (std::int64_t i = 0; i < rows * 12; ++i)
      ASSERT_EQ(read[i], i < written * 12 ? static_cast<float>(values[i]) : 0.0f) << i;
  }
}

// A file with a user block: HDF5's addresses count from the block's end, so a direct read at them would read the
// wrong bytes; such files are left to HDF5 (addresses_are_file_offsets, shared with checkpoint reads).
TEST_F(DirectReadTest, AFileWithAUserBlockIsLeftToHdf5) {
  const std::int64_t rows = 20;
  const std::vector<double> values = values_for(H5T_IEEE_F32LE, rows);
  const std::string plain = path("plain.h5"), blocked = path("user-block.h5");
  write_values(plain, H5T_IEEE_F32LE, {}, rows, values);
  {
    const auto lock = lock_hdf5();
    H5Handle creation(H5Pcreate(H5P_FILE_CREATE));
    ASSERT_GE(H5Pset_userblock(creation.get(), 512), 0);
    H5Handle file(H5Fcreate(blocked.c_str(), H5F_ACC_TRUNC, creation.get(), H5P_DEFAULT));
    const hsize_t dims[3] = {static_cast<hsize_t>(rows), 4, 3};
    H5Handle space(H5Screate_simple(3, dims, nullptr));
    H5Handle dataset(H5Dcreate2(file.get(), "/x", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Dwrite(dataset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    EXPECT_FALSE(addresses_are_file_offsets(file.get()));
  }
  {
    const auto lock = lock_hdf5();
    H5Handle file(H5Fopen(plain.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    EXPECT_TRUE(addresses_are_file_offsets(file.get()));
  }
  const auto dataset = open_with(blocked, true);
  EXPECT_FALSE(dataset->reads_directly());
  std::vector<float> read(static_cast<std::size_t>(rows * 12));
  dataset->read_range(0, rows, read.data());
  for (std::int64_t i = 0; i < rows * 12; ++i) ASSERT_EQ(read[i], static_cast<float>(values[i])) << i;
}

// The message of the InputError f() throws ("" when it throws nothing).
template <class F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

// The direct path checks the file's size only for reads that reach the map's last page and otherwise relies on the
// SIGBUS of a touch of that page: a shrink that removes the last page fails every read, one that keeps part of it fails
// the reads of rows in it, and rows it leaves alone read unchanged. Every such read fails, each time it is repeated.
TEST_F(DirectReadTest, AFileThatShrinksUnderTheMapFailsEveryReadItCanChange) {
  const std::int64_t rows = 4096;  // 48 bytes each: 192 KiB, many pages
  const std::vector<double> values = values_for(H5T_IEEE_F32LE, rows);
  const std::string original = path("original.h5");
  write_values(original, H5T_IEEE_F32LE, {}, rows, values);
  std::uint64_t data_offset = 0;
  {
    const auto lock = lock_hdf5();
    H5Handle file(H5Fopen(original.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    H5Handle dataset(H5Dopen2(file.get(), "/x", H5P_DEFAULT));
    data_offset = H5Dget_offset(dataset.get());
  }
  const std::uint64_t row_bytes = 12 * sizeof(float), file_bytes = fs::file_size(original);
  const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE)),
                      last_page = (file_bytes - 1) / page * page;
  const std::uint64_t data_end = data_offset + rows * row_bytes;
  // HDF5 puts a contiguous dataset's data after its metadata: the last rows lie in the file's last page.
  ASSERT_GT(data_end, last_page + 2 * row_bytes) << "offset " << data_offset << ", file " << file_bytes;
  ASSERT_LT(data_offset + row_bytes, last_page);
  const std::int64_t last_row = rows - 1;
  std::vector<float> read(12 * 4);
  auto read_rows = [&](std::int64_t row, Hdf5Dataset& dataset) {
    const std::int64_t indices[2] = {row, 0};
    dataset.read_rows(indices, 2, read.data());
  };
  auto expect_fails = [&](const char* what, auto&& f) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const std::string message = input_error_of(f);
      EXPECT_NE(message.find("shrank from " + std::to_string(file_bytes)), std::string::npos)
          << what << ", attempt " << attempt << ": " << message;
    }
  };

  {  // shrunk to half its data: the last page is gone, so even row 0, which is intact, fails
    const std::string file = path("halved.h5");
    fs::copy_file(original, file);
    const auto dataset = open_with(file, true);
    ASSERT_TRUE(dataset->reads_directly());
    fs::resize_file(file, data_offset + rows / 2 * row_bytes);
    expect_fails("read_rows of row 0", [&] { read_rows(0, *dataset); });
    expect_fails("read_range of row 0", [&] { dataset->read_range(0, 1, read.data()); });
    std::vector<unsigned char> stored(row_bytes);
    const std::int64_t first_row = 0;
    expect_fails("read_rows_stored of row 0", [&] { dataset->read_rows_stored(&first_row, 1, stored.data()); });
  }
  {  // shrunk by a row and a byte, inside the last page: the last row fails, row 0 reads unchanged
    const std::string file = path("trimmed.h5");
    fs::copy_file(original, file);
    const auto dataset = open_with(file, true);
    fs::resize_file(file, data_end - row_bytes - 1);
    expect_fails("read_rows of the last row", [&] { read_rows(last_row, *dataset); });
    expect_fails("read_range of the last row", [&] { dataset->read_range(last_row, 1, read.data()); });
    read_rows(1, *dataset);
    for (std::int64_t i = 0; i < 24; ++i) ASSERT_EQ(read[i], static_cast<float>(values[i < 12 ? 12 + i : i - 12])) << i;
  }
}

}  // namespace
}  // namespace hpctrain
