// allocate_staged_bytes: the alignment it promises, memory that holds what is written to every byte, and (where the
// kernel has transparent huge pages) the MADV_HUGEPAGE advice on the memory asked for on huge pages, read back from
// the mapping's VmFlags ("hg") in /proc/self/smaps: set by the advice whether or not huge pages are free.
#include "hpctrain/core/staged_array.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace hpctrain {
namespace {

// The VmFlags line of the mapping that holds `address`, or "" when none is found.
std::string vm_flags_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find('-') < line.find(' '))
      inside = begin <= at && at < end;
    else if (inside && line.starts_with("VmFlags:"))
      return line;
  }
  return "";
}

TEST(StagedArray, AlignedAndWritableAtEverySize) {
  for (const bool huge_pages : {false, true})
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{3} << 20}) {
      StagedArray<std::int32_t> array = allocate_staged_array<std::int32_t>(count, huge_pages);
      ASSERT_NE(array.get(), nullptr);
      const std::uintptr_t alignment = huge_pages ? std::uintptr_t{2} << 20 : 64;
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(array.get()) % alignment, 0u) << count << " " << huge_pages;
      for (std::size_t i = 0; i < count; ++i) array[i] = static_cast<std::int32_t>(i * 2654435761u);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(array[i], static_cast<std::int32_t>(i * 2654435761u)) << i;
    }
}

TEST(StagedArray, HugePagesAreAdvised) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  const StagedArray<float> array = allocate_staged_array<float>(std::size_t{4} << 20, true);  // 16 MiB
  for (std::size_t i = 0; i < (std::size_t{4} << 20); i += 1024) array[i] = 1.0f;
  const std::string flags = vm_flags_of(array.get() + (std::size_t{2} << 20));
  ASSERT_FALSE(flags.empty()) << "no mapping found in /proc/self/smaps";
  std::istringstream words(flags.substr(8));
  bool advised = false;
  for (std::string word; words >> word;) advised = advised || word == "hg";
  EXPECT_TRUE(advised) << flags;
}

}  // namespace
}  // namespace hpctrain
