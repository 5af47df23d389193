// Tests of io/crc32.hpp: every CRC-32 kernel this CPU runs gives zlib's value bit for bit, on random bytes of every
// length around the kernels' block sizes (64, 128 and 256 bytes), at unaligned starts, continuing from a CRC, and on a
// message long enough for the main loops; and the published check value of CRC-32.
#include "hpctrain/io/crc32.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <random>
#include <string>
#include <vector>

namespace hpctrain {
namespace {

constexpr Crc32Kernel all_kernels[] = {Crc32Kernel::zlib, Crc32Kernel::clmul128, Crc32Kernel::clmul256,
                                       Crc32Kernel::clmul512};

std::vector<unsigned char> random_bytes(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::vector<unsigned char> bytes(count);
  for (unsigned char& byte : bytes) byte = static_cast<unsigned char>(generator());
  return bytes;
}

// The reference: zlib's table loop.
std::uint32_t zlib_reference(const unsigned char* data, std::size_t bytes, std::uint32_t crc) {
  return static_cast<std::uint32_t>(::crc32(crc, data, static_cast<uInt>(bytes)));
}

TEST(Crc32Test, EveryKernelMatchesZlibAtEveryLengthAndAlignment) {
  const std::vector<unsigned char> data = random_bytes(4096 + 64, 1);
  int kernels_run = 0;
  for (Crc32Kernel kernel : all_kernels) {
    if (!crc32_kernel_available(kernel)) continue;
    ++kernels_run;
    for (std::size_t offset : {0, 1, 3, 8, 15})
      for (std::size_t length = 0; length <= 1100; ++length)
        for (std::uint32_t start : {0u, 0x9E3779B9u}) {
          const unsigned char* first = data.data() + offset;
          ASSERT_EQ(crc32_with(kernel, first, length, start), zlib_reference(first, length, start))
              << "kernel " << static_cast<int>(kernel) << ", offset " << offset << ", length " << length;
        }
  }
  EXPECT_GE(kernels_run, 1);
}

TEST(Crc32Test, LongMessagesAndPiecesAgreeWithZlib) {
  const std::vector<unsigned char> data = random_bytes((std::size_t{3} << 20) + 77, 2);
  const std::uint32_t expected = zlib_reference(data.data(), data.size(), 0);
  for (Crc32Kernel kernel : all_kernels) {
    if (!crc32_kernel_available(kernel)) continue;
    EXPECT_EQ(crc32_with(kernel, data.data(), data.size()), expected) << "kernel " << static_cast<int>(kernel);
    // Continuing from a CRC: two pieces of odd lengths give the CRC of the whole.
    const std::size_t split = 1000003;
    EXPECT_EQ(crc32_with(kernel, data.data() + split, data.size() - split, crc32_with(kernel, data.data(), split)),
              expected);
  }
  EXPECT_EQ(crc32(data.data(), data.size()), expected);  // the kernel chosen for this CPU
}

// crc32_parallel: 1 MiB pieces on the threads, joined in order: zlib's value for lengths below, at and across the
// pieces' boundaries, continuing from a CRC, and inside a parallel region (where it runs alone).
TEST(Crc32Test, ParallelPiecesAgreeWithZlib) {
  const std::vector<unsigned char> data = random_bytes((std::size_t{3} << 20) + 77, 3);
  for (const std::size_t length : {std::size_t{0}, std::size_t{1000}, std::size_t{1} << 20, (std::size_t{1} << 20) + 1,
                                   (std::size_t{2} << 20) + 5, data.size()})
    for (std::uint32_t start : {0u, 0x9E3779B9u})
      EXPECT_EQ(crc32_parallel(data.data(), length, start), zlib_reference(data.data(), length, start))
          << length << " bytes";
  std::uint32_t inside = 0;
#pragma omp parallel num_threads(2)
#pragma omp single
  inside = crc32_parallel(data.data(), data.size());
  EXPECT_EQ(inside, zlib_reference(data.data(), data.size(), 0));
}

TEST(Crc32Test, GivesThePublishedCheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(crc32(text.data(), text.size()), 0xCBF43926u);
  for (Crc32Kernel kernel : all_kernels)
    if (crc32_kernel_available(kernel)) EXPECT_EQ(crc32_with(kernel, text.data(), text.size()), 0xCBF43926u);
}

TEST(Crc32Test, AKernelThisCpuLacksIsRefused) {
  for (Crc32Kernel kernel : all_kernels)
    if (!crc32_kernel_available(kernel)) EXPECT_THROW((void)crc32_with(kernel, "x", 1), std::invalid_argument);
  EXPECT_TRUE(crc32_kernel_available(Crc32Kernel::zlib));
}

}  // namespace
}  // namespace hpctrain
