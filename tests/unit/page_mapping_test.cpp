// page_mapping: the resident bytes of a file map follow what the test touched, a huge-page share never exceeds them,
// and an address that starts no mapping gives nothing.
#include "hpctrain/core/page_mapping.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace hpctrain {
namespace {

TEST(PageMapping, FollowsTheTouchedPagesOfAFileMap) {
  const std::size_t bytes = std::size_t{1} << 20;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("hpctrain-page-mapping-" + std::to_string(::getpid()) + ".bin"))
          .string();
  {
    std::vector<char> data(bytes);
    std::mt19937 generator(3);
    for (char& value : data) value = static_cast<char>(generator());
    std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(bytes));
  }
  const int descriptor = open(path.c_str(), O_RDONLY);
  ASSERT_GE(descriptor, 0);
  auto* map = static_cast<const volatile unsigned char*>(mmap(nullptr, bytes, PROT_READ, MAP_SHARED, descriptor, 0));
  ASSERT_NE(map, MAP_FAILED);
  const void* start = const_cast<const unsigned char*>(map);

  const std::optional<PageMapping> untouched = page_mapping(start);
  ASSERT_TRUE(untouched.has_value()) << "no mapping found in /proc/self/smaps";
  EXPECT_EQ(untouched->resident_bytes, 0u);
  unsigned sum = 0;
  for (std::size_t byte = 0; byte < bytes; byte += 4096) sum += map[byte];
  const std::optional<PageMapping> touched = page_mapping(start);
  ASSERT_TRUE(touched.has_value());
  EXPECT_EQ(touched->resident_bytes, bytes) << "sum " << sum;
  EXPECT_LE(touched->huge_bytes, touched->resident_bytes);
  EXPECT_FALSE(page_mapping(const_cast<const unsigned char*>(map) + 4096).has_value());  // inside, not a start

  munmap(const_cast<unsigned char*>(map), bytes);
  close(descriptor);
  std::filesystem::remove(path);
  EXPECT_FALSE(page_mapping(start).has_value());  // unmapped
}

}  // namespace
}  // namespace hpctrain
