// The layout hpctrain's data writers give a file for random row reads (io/hdf5.hpp): datasets of 64 MiB or more on
// 2 MiB boundaries with little padding, one preallocated extent per dataset with no fill values written, and write
// blocks of whole 2 MiB pieces where the row size allows.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "hpctrain/io/hdf5.hpp"
#include "temporary_directory.hpp"

namespace hpctrain {
namespace {

constexpr std::int64_t mib = std::int64_t{1} << 20;

TEST(FolioBlockRows, WholeTwoMibPiecesWhereTheyFit) {
  EXPECT_EQ(folio_block_rows(1024, 16 * mib), 16384);  // 16 MiB: 8 pieces
  EXPECT_EQ(folio_block_rows(12, 16 * mib), 1048576);  // 12 MiB: 6 pieces (2^19 rows make 3 pieces)
  EXPECT_EQ(folio_block_rows(4000, 16 * mib),
            16 * mib / 4000);                          // a piece takes 65536 rows (250 MiB): the most that fit
  EXPECT_EQ(folio_block_rows(3 * mib, 16 * mib), 4);   // 12 MiB: 2 rows make 3 pieces
  EXPECT_EQ(folio_block_rows(20 * mib, 16 * mib), 1);  // one row larger than a block: one row

  // Every row size: at least one row; no more bytes than the block (or one row); whole pieces whenever some whole
  // number of pieces fits, and then the most rows that make whole pieces.
  for (std::int64_t row_bytes = 1; row_bytes < 40000; row_bytes += 7) {
    for (const std::int64_t most : {4 * mib, 16 * mib}) {
      const std::int64_t rows = folio_block_rows(row_bytes, most);
      ASSERT_GE(rows, 1);
      ASSERT_LE(rows * row_bytes, std::max(most, row_bytes)) << row_bytes;
      const std::int64_t whole = large_folio_bytes / std::gcd(large_folio_bytes, row_bytes);
      if (whole * row_bytes <= most) {
        ASSERT_EQ(rows * row_bytes % large_folio_bytes, 0) << row_bytes;
        ASSERT_GT((rows + whole) * row_bytes, most) << row_bytes << ": a larger whole number of pieces fits";
      } else {
        ASSERT_EQ(rows, std::max<std::int64_t>(1, most / row_bytes)) << row_bytes;
      }
    }
  }
}

using DataFileLayoutTest = testing_support::TemporaryDirectoryTest;

// Creates `names` as fixed-size float32 datasets of rows of 256 values (1 KiB) with `rows` rows each, in that order,
// with row_dataset_layout, writes nothing, and returns each dataset's file offset; the file's size in `file_bytes`.
std::vector<haddr_t> create_datasets(H5Handle file, const std::vector<std::pair<std::string, std::int64_t>>& datasets,
                                     const std::string& path, std::uintmax_t& file_bytes) {
  std::vector<haddr_t> offsets;
  for (const auto& [name, rows] : datasets) {
    const hsize_t shape[2] = {static_cast<hsize_t>(rows), 256};
    const H5Handle space(H5Screate_simple(2, shape, nullptr));
    const H5Handle creation = row_dataset_layout();
    const H5Handle dataset(
        H5Dcreate2(file.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, creation.get(), H5P_DEFAULT));
    EXPECT_TRUE(dataset.valid());
    EXPECT_EQ(storage_description(dataset.get()), "contiguous");
    offsets.push_back(H5Dget_offset(dataset.get()));  // allocated at creation: defined before any write
  }
  file.close();
  file_bytes = std::filesystem::file_size(path);
  return offsets;
}

TEST_F(DataFileLayoutTest, LargeDatasetsStartOnTwoMibBoundariesWithLittlePadding) {
  std::uintmax_t file_bytes = 0;
  // 1 MiB, then 64 MiB (the threshold), then 65 MiB.
  const std::vector<haddr_t> offsets =
      create_datasets(create_data_file(path("data.h5")), {{"/small", 1024}, {"/large", 65536}, {"/larger", 66560}},
                      path("data.h5"), file_bytes);
  ASSERT_EQ(offsets.size(), 3u);
  for (const haddr_t offset : offsets) ASSERT_NE(offset, HADDR_UNDEF);
  EXPECT_NE(offsets[0] % large_folio_bytes, 0u) << "a small dataset packs with the metadata";
  EXPECT_EQ(offsets[1] % large_folio_bytes, 0u);
  EXPECT_EQ(offsets[2] % large_folio_bytes, 0u);
  const std::uintmax_t data_bytes = (1 + 64 + 65) * mib;
  EXPECT_GE(file_bytes, data_bytes);
  EXPECT_LE(file_bytes, data_bytes + 2 * large_folio_bytes) << "at most 2 MiB of padding per aligned dataset";

  // The same datasets in a file of create_file pack without gaps: the 64 MiB one lands off a 2 MiB boundary.
  const std::vector<haddr_t> packed =
      create_datasets(create_file(path("packed.h5")), {{"/small", 1024}, {"/large", 65536}, {"/larger", 66560}},
                      path("packed.h5"), file_bytes);
  EXPECT_NE(packed[1] % large_folio_bytes, 0u);
  EXPECT_LT(file_bytes, data_bytes + 64 * 1024);
}

TEST_F(DataFileLayoutTest, NoFillValuesAreWritten) {
  // Preallocated without fill values: the file's blocks stay unwritten (sparse) until the writer fills them. Writing
  // fill values first would leave the page cache in the fill writes' small folios.
  std::uintmax_t file_bytes = 0;
  create_datasets(create_data_file(path("sparse.h5")), {{"/features", 65536}}, path("sparse.h5"), file_bytes);
  EXPECT_GE(file_bytes, static_cast<std::uintmax_t>(64 * mib));
  struct stat status {};
  ASSERT_EQ(stat(path("sparse.h5").c_str(), &status), 0);
  EXPECT_LT(static_cast<std::int64_t>(status.st_blocks) * 512, 4 * mib) << "the 64 MiB extent was written";
}

}  // namespace
}  // namespace hpctrain
