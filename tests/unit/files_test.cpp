// Tests of core/files.hpp and core/numbers.hpp: a file replaced atomically is either the old one or the complete new
// one and no temporary is left after a failed write; a write failure is said in words a user can act on (the file
// system full, a quota, the file-size limit), also when only the free space or the limit explain it.
#include "hpctrain/core/files.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cerrno>
#include <fstream>
#include <stdexcept>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "temporary_directory.hpp"

namespace hpctrain {
namespace {

using FilesTest = testing_support::TemporaryDirectoryTest;

std::string contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(FilesTest, AFileIsReplacedOnlyWhenItsWriteSucceeds) {
  const std::string file = path("latest");
  write_text_file_atomically(file, "one\n");
  EXPECT_EQ(contents(file), "one\n");
  EXPECT_THROW(write_file_atomically(file,
                                     [](const std::string& temporary) {
                                       std::ofstream(temporary) << "half";
                                       throw std::runtime_error("disk full");
                                     }),
               std::runtime_error);
  EXPECT_EQ(contents(file), "one\n");
  EXPECT_FALSE(std::filesystem::exists(partial_path(file)));
  write_text_file_atomically(file, "two\n");
  EXPECT_EQ(contents(file), "two\n");
  EXPECT_FALSE(std::filesystem::exists(partial_path(file)));
}

TEST_F(FilesTest, PointerFilesAreCommittedWithTheFileTheyName) {
  const std::string file = path("step-00000002.h5"), latest = path("latest"), best = path("best");
  write_text_file_atomically(latest, "step-00000001.h5\n");
  std::ofstream(partial_path(file)) << "checkpoint";
  commit_file(partial_path(file), file, {{latest, "step-00000002.h5\n"}, {best, "step-00000002.h5\n"}});
  EXPECT_EQ(contents(file), "checkpoint");
  EXPECT_EQ(contents(latest), "step-00000002.h5\n");
  EXPECT_EQ(contents(best), "step-00000002.h5\n");
  for (const std::string& name : {file, latest, best}) EXPECT_FALSE(std::filesystem::exists(partial_path(name)));
  // A companion that cannot be written (its partial name is a directory): nothing is renamed, no temporary is left.
  const std::string next = path("step-00000003.h5");
  std::ofstream(partial_path(next)) << "next";
  std::filesystem::create_directory(partial_path(best));
  EXPECT_THROW(commit_file(partial_path(next), next, {{latest, "step-00000003.h5\n"}, {best, "step-00000003.h5\n"}}),
               Error);
  EXPECT_FALSE(std::filesystem::exists(next));
  EXPECT_FALSE(std::filesystem::exists(partial_path(next)));
  EXPECT_FALSE(std::filesystem::exists(partial_path(latest)));
  EXPECT_EQ(contents(latest), "step-00000002.h5\n");
}

TEST_F(FilesTest, WriteFailuresSayWhy) {
  const std::string file = path("step-00000001.h5");
  const std::string full = write_failure_reason(ENOSPC, "", file, 3 << 20, "the checkpoint");
  EXPECT_EQ(full.rfind("the file system is full (", 0), 0u) << full;
  EXPECT_NE(full.find(" free in " + directory_.string() + "; the checkpoint needs about 3.0 MiB)"), std::string::npos)
      << full;
  EXPECT_EQ(write_failure_reason(EDQUOT, "", file, 0, "x"),
            "the disk quota for " + directory_.string() + " is exceeded");
  EXPECT_EQ(write_failure_reason(0, "can't write data", file, 0, "x"), "can't write data");
  EXPECT_EQ(write_failure_reason(EIO, "", file, 0, "x"), "Input/output error");
  // Nothing reported: more than the free space is needed, so the disk is full.
  const std::string inferred = write_failure_reason(0, "can't write data", file, ~std::uintmax_t{0} / 2, "it");
  EXPECT_EQ(inferred.rfind("the file system is full", 0), 0u) << inferred;
}

TEST_F(FilesTest, AFileSizeLimitIsNamed) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = 400 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string reported = write_failure_reason(EFBIG, "", path("f.h5"), 1 << 20, "the checkpoint");
  const std::string inferred = write_failure_reason(0, "", path("f.h5"), 1 << 20, "the checkpoint");
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  const std::string expected =
      "the file would pass the file-size limit (ulimit -f) of 400.0 KiB (the checkpoint needs about 1.0 MiB)";
  EXPECT_EQ(reported, expected);
  EXPECT_EQ(inferred, expected);
}

TEST(Numbers, OneTextFormEach) {
  EXPECT_EQ(number_text(0.1234567), "0.123457");
  EXPECT_EQ(number_text(1e6), "1e+06");
  EXPECT_EQ(shortest_number_text(0.1), "0.1");
  EXPECT_EQ(byte_size_text(512), "512 bytes");
  EXPECT_EQ(byte_size_text(400 << 10), "400.0 KiB");
  EXPECT_EQ(byte_size_text(1677722), "1.6 MiB");
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({}), 0);
}

}  // namespace
}  // namespace hpctrain
