// copy_bytes against the bytes it was given: every size around its 64-byte blocks and its 2 KiB threshold, at every
// distance between destination and source that picks a different path (0, the aliasing band 1-63, beyond it), copies
// exactly the source's bytes and nothing past either end of the destination; stream_bytes likewise. read_at_streaming
// likewise against a file's bytes, through more than one of its pieces, with its visits, and its errors.
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

using CopyFunction = void (*)(void*, const void*, std::size_t);

void expect_exact_copies(CopyFunction copy) {
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
  const std::size_t sizes[] = {0, 1, 63, 64, 65, 255, 256, 257, 2047, 2048, 2049, 4095, 4096, 4160, 12345, 65536};
  const std::size_t distances[] = {0, 1, 8, 16, 31, 32, 48, 63, 64, 100, 2048, 4080, 4095};
  for (const std::size_t source_offset : {std::size_t{0}, std::size_t{24}, std::size_t{1000}}) {
    for (const std::size_t distance : distances) {
      const unsigned char* source = source_base + source_offset;
      unsigned char* target = target_base + (source_offset + distance) % page;
      for (const std::size_t size : sizes) {
        std::fill(target - guard, target + size + guard, poison);
        copy(target, source, size);
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

TEST(CopyBytes, CopiesEveryByteAtEveryDistanceAndSize) { expect_exact_copies(copy_bytes); }

// The distances also put the destination at every alignment to its 64-byte lines that the tests reach (0, 1, 8, 16,
// 24, 31, 32, 48, 63 bytes past one): stream_bytes' head before its first whole line, and its tail after the last.
TEST(StreamBytes, CopiesEveryByteAtEveryDistanceAndSize) { expect_exact_copies(stream_bytes); }

// A file of random bytes, 2.5 MiB and a little: many of read_at_streaming's pieces.
class FileReads : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 generator(23);
    std::uniform_int_distribution<int> byte(0, 255);
    contents_.resize((std::size_t{5} << 19) + 333);
    for (unsigned char& value : contents_) value = static_cast<unsigned char>(byte(generator));
    file_ = (std::filesystem::temp_directory_path() / ("hpctrain-read-at-" + std::to_string(::getpid()))).string();
    std::FILE* out = std::fopen(file_.c_str(), "wb");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(std::fwrite(contents_.data(), 1, contents_.size(), out), contents_.size());
    ASSERT_EQ(std::fclose(out), 0);
    descriptor_ = ::open(file_.c_str(), O_RDONLY);
    ASSERT_GE(descriptor_, 0);
  }
  void TearDown() override {
    if (descriptor_ >= 0) ::close(descriptor_);
    std::filesystem::remove(file_);
  }

  // read(descriptor, to, bytes, offset) at every distance that picks a path, at offsets on and off a page, for sizes
  // within one piece and across several: exactly the file's bytes, nothing written outside the destination; and -1
  // where the file ends inside the request.
  template <class Read>
  void expect_exact_reads(Read&& read) {
    std::vector<unsigned char> buffer(contents_.size() + 2 * page + 2 * guard);
    unsigned char* const base =
        buffer.data() + guard + (page - reinterpret_cast<std::uintptr_t>(buffer.data() + guard) % page) % page;
    const std::size_t sizes[] = {100, 4096, 70000, (std::size_t{5} << 19) - 16384};
    for (const std::size_t offset : {std::size_t{0}, std::size_t{8}, std::size_t{3 * 4096 + 17}})
      for (const std::size_t distance : {0, 1, 16, 31, 48, 63, 64, 2048})
        for (const std::size_t size : sizes) {
          unsigned char* target = base + (offset + distance) % page;
          std::fill(target - guard, target + size + guard, poison);
          ASSERT_EQ(read(descriptor_, target, size, offset), 0);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < size; ++i) wrong += target[i] != contents_[offset + i];
          for (std::size_t i = 1; i <= guard; ++i) wrong += (target[-static_cast<std::ptrdiff_t>(i)] != poison);
          for (std::size_t i = 0; i < guard; ++i) wrong += (target[size + i] != poison);
          ASSERT_EQ(wrong, 0u) << size << " bytes at offset " << offset << ", destination " << distance
                               << " bytes past it modulo 4 KiB";
        }
    EXPECT_EQ(read(descriptor_, base, 8192, contents_.size() - 100), -1);
    EXPECT_EQ(read(descriptor_, base + 16, 8192, contents_.size() - 100), -1);
  }

  std::vector<unsigned char> contents_;
  std::string file_;
  int descriptor_ = -1;
};

// read_at_streaming, and its visits: in order, one after the other from the request's start to its end,
// none over 256 KiB, each showing the file's bytes at its position.
TEST_F(FileReads, ReadAtStreamingReadsAndVisitsTheFilesBytes) {
  expect_exact_reads([&](int descriptor, void* to, std::size_t bytes, std::uint64_t offset) {
    std::size_t visited = 0, wrong = 0, too_long = 0;
    const int status = read_at_streaming(descriptor, to, bytes, offset,
                                         [&](const unsigned char* piece, std::size_t position, std::size_t length) {
                                           wrong += position != visited;
                                           too_long += length > (std::size_t{256} << 10);
                                           for (std::size_t i = 0; i < length; ++i)
                                             wrong += piece[i] != contents_[offset + position + i];
                                           visited = position + length;
                                         });
    EXPECT_EQ(wrong, 0u) << "visits of " << bytes << " bytes at offset " << offset;
    EXPECT_EQ(too_long, 0u);
    if (status == 0) EXPECT_EQ(visited, bytes);
    return status;
  });
  ::close(descriptor_);
  EXPECT_EQ(read_at_streaming(descriptor_, contents_.data(), 8192, 0, {}), EBADF);  // closed
  descriptor_ = -1;
}

}  // namespace
}  // namespace hpctrain
