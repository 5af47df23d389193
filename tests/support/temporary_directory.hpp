// A fresh directory per test (named after the test, the process and a random number), removed afterwards.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

namespace hpctrain::testing_support {

class TemporaryDirectoryTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    directory_ = std::filesystem::temp_directory_path() /
                 ("hpctrain-" + std::string(info->name()) + "-" + std::to_string(::getpid()) + "-" +
                  std::to_string(std::random_device{}()));
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }
  [[nodiscard]] std::string path(const std::string& name) const { return (directory_ / name).string(); }

  std::filesystem::path directory_;
};

}  // namespace hpctrain::testing_support
