// copy_bytes against the bytes it was given: every size around its 64-byte blocks and its 2 KiB threshold, at every
// distance between destination and source that picks a different path (0, the aliasing band 1-63, beyond it), copies
// exactly the source's bytes and nothing past either end of the destination. read_at likewise against a file's
// bytes, through its bounce buffer (more than one of its pieces) and without, and its errors.
#include "hpctrain/core/copy_bytes.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace hpctrain {
namespace {

constexpr std::size_t page = 4096, guard = 128;
constexpr unsigned char poison = 0xA5;

TEST(CopyBytes, CopiesEveryByteAtEveryDistanceAndSize) {
  std::mt19937 generator(17);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<unsigned char> source_buffer(3 * page + 70000), target_buffer(3 * page + 70000 + 2 * guard);
  for (unsigned char& value : source_buffer) value = static_cast<unsigned char>(byte(generator));
  // Page-aligned bases, so that an offset below sets the distance modulo 4 KiB exactly.
  const auto page_aligned = [](unsigned char* pointer) {
    return pointer + (page - reinterpret_cast<std::uintptr_t>(pointer) % page) % page;
  };
  unsigned char* const source_base = page_aligned(source_buffer.data());
  unsigned char* const target_base = page_aligned(target_buffer.data() + guard);  // guard bytes before it
  const std::size_t sizes[] = {0, 1, 63, 64, 65, 2047, 2048, 2049, 4095, 4096, 4160, 12345, 65536};
  const std::size_t distances[] = {0, 1, 8, 16, 31, 32, 48, 63, 64, 100, 2048, 4080, 4095};
  for (const std::size_t source_offset : {std::size_t{0}, std::size_t{24}, std::size_t{1000}}) {
    for (const std::size_t distance : distances) {
      const unsigned char* source = source_base + source_offset;
      unsigned char* target = target_base + (source_offset + distance) % page;
      for (const std::size_t size : sizes) {
        std::fill(target - guard, target + size + guard, poison);
        copy_bytes(target, source, size);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < size; ++i) wrong += target[i] != source[i];
        for (std::size_t i = 1; i <= guard; ++i) wrong += (target[-static_cast<std::ptrdiff_t>(i)] != poison);
        for (std::size_t i = 0; i < guard; ++i) wrong += (target[size + i] != poison);
        ASSERT_EQ(wrong, 0u) << size << " bytes, destination " << distance << " bytes past the source modulo 4 KiB, "
                             << "source " << source_offset << " bytes past a page";
      }
    }
  }
}

TEST(ReadAt, ReadsTheFilesBytesAtEveryDistanceAndOffset) {
  std::mt19937 generator(23);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<unsigned char> contents((std::size_t{5} << 19) + 333);  // 2.5 MiB: more than one bounce piece
  for (unsigned char& value : contents) value = static_cast<unsigned char>(byte(generator));
  const std::string file =
      (std::filesystem::temp_directory_path() / ("hpctrain-read-at-" + std::to_string(::getpid()))).string();
  {
    std::FILE* out = std::fopen(file.c_str(), "wb");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(std::fwrite(contents.data(), 1, contents.size(), out), contents.size());
    ASSERT_EQ(std::fclose(out), 0);
  }
  const int descriptor = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(descriptor, 0);
  std::vector<unsigned char> buffer(contents.size() + 2 * page + 2 * guard);
  unsigned char* const base =
      buffer.data() + guard + (page - reinterpret_cast<std::uintptr_t>(buffer.data() + guard) % page) % page;
  const std::size_t sizes[] = {100, 4096, 70000, (std::size_t{5} << 19) - 16384};
  for (const std::size_t offset : {std::size_t{0}, std::size_t{8}, std::size_t{3 * 4096 + 17}})
    for (const std::size_t distance : {0, 1, 16, 31, 48, 63, 64, 2048})
      for (const std::size_t size : sizes) {
        unsigned char* target = base + (offset + distance) % page;
        std::fill(target - guard, target + size + guard, poison);
        ASSERT_EQ(read_at(descriptor, target, size, offset), 0);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < size; ++i) wrong += target[i] != contents[offset + i];
        for (std::size_t i = 1; i <= guard; ++i) wrong += (target[-static_cast<std::ptrdiff_t>(i)] != poison);
        for (std::size_t i = 0; i < guard; ++i) wrong += (target[size + i] != poison);
        ASSERT_EQ(wrong, 0u) << size << " bytes at offset " << offset << ", destination " << distance
                             << " bytes past it modulo 4 KiB";
      }
  // The file ends inside the request: -1, through the bounce buffer or not.
  EXPECT_EQ(read_at(descriptor, base, 8192, contents.size() - 100), -1);
  EXPECT_EQ(read_at(descriptor, base + 16, 8192, contents.size() - 100), -1);
  ::close(descriptor);
  std::filesystem::remove(file);
  EXPECT_EQ(read_at(descriptor, base, 8192, 0), EBADF);  // closed
}

}  // namespace
}  // namespace hpctrain
