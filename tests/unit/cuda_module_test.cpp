// The CUDA module boundary (include/hpctrain/kernels/cuda_module.hpp) on any machine, GPU or not.
// - Opening logic, in every build, with stand-in modules (tests/support/fake_cuda_module.cpp): a module of this build
//   opens and its table is called (an hpctrain error thrown inside reaches the caller as that type); a missing file, a
//   file that is no library, a library without the entry point, a module of another build and a module whose library
//   the loader cannot find are refused, each with the path and the reason; where the module is looked for.
// - The module this build made (skipped in builds without it): it opens from the test program (its calls back into
//   the program resolve), its table is this build's, it counts the devices the driver does, and its errors reach the
//   caller by type.
#include "hpctrain/kernels/cuda_module.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "temporary_directory.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(CudaModuleOpening, AModuleOfThisBuildOpensAndItsErrorsKeepTheirType) {
  std::string why = "untouched";
  const CudaModuleTable* table = open_cuda_module(FAKE_CUDA_MODULE_this_build, &why);
  ASSERT_NE(table, nullptr) << why;
  EXPECT_EQ(why, "untouched") << "no reason is given on success";
  EXPECT_EQ(table->abi, cuda_module_abi);
  EXPECT_STREQ(table->features, "fake");
  EXPECT_EQ(table->device_count(), 3);
  try {
    (void)table->make_backend(5);
    ADD_FAILURE() << "the fake module made a backend";
  } catch (const InputError& error) {
    EXPECT_TRUE(contains(error.what(), "fake CUDA module: no backend on device 5")) << error.what();
  }
}

using CudaModuleFiles = testing_support::TemporaryDirectoryTest;

TEST_F(CudaModuleFiles, AMissingFileIsNamed) {
  const std::string path = this->path("lib/libhpctrain_cuda.so");
  std::string why;
  EXPECT_EQ(open_cuda_module(path, &why), nullptr);
  EXPECT_EQ(why, path + " is missing: install it with the executable, or point HPCTRAIN_CUDA_MODULE at it");
}

TEST_F(CudaModuleFiles, AFileThatIsNoLibraryGetsTheLoadersReason) {
  const std::string path = this->path("libhpctrain_cuda.so");
  std::ofstream(path) << "not a shared library, long enough to have an ELF header's length of bytes in it\n";
  std::string why;
  EXPECT_EQ(open_cuda_module(path, &why), nullptr);
  EXPECT_EQ(why.rfind(path + ": ", 0), 0u) << why;
  EXPECT_GT(why.size(), path.size() + 2) << "the loader's reason follows the path";
  EXPECT_FALSE(contains(why.substr(path.size() + 2), path)) << "the path once: " << why;
}

TEST(CudaModuleOpening, ALibraryWithoutTheEntryPointIsRefused) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&MPI_Init), &info), 0);  // the MPI library: a real one, loaded already
  ASSERT_NE(info.dli_fname, nullptr);
  std::string why;
  EXPECT_EQ(open_cuda_module(info.dli_fname, &why), nullptr);
  EXPECT_EQ(why, std::string(info.dli_fname) + " is not an hpctrain CUDA module (no hpctrain_cuda_module symbol)");
}

TEST(CudaModuleOpening, AModuleOfAnotherBuildIsRefused) {
  std::string why;
  EXPECT_EQ(open_cuda_module(FAKE_CUDA_MODULE_other_build, &why), nullptr);
  EXPECT_EQ(why, std::string(FAKE_CUDA_MODULE_other_build) + " belongs to another build of hpctrain (this one is " +
                     HPCTRAIN_VERSION + "): install the module built with this executable");
}

TEST(CudaModuleOpening, AMissingLibraryOfTheModuleIsNamedWithTheModule) {
  std::string why;
  EXPECT_EQ(open_cuda_module(FAKE_CUDA_MODULE_missing_library, &why), nullptr);
  const std::string expected =
      std::string(FAKE_CUDA_MODULE_missing_library) + ": libhpctrain_test_absent.so: cannot open shared object file";
  EXPECT_EQ(why.rfind(expected, 0), 0u) << why;
}

TEST(CudaModuleOpening, LooksBesideTheProgramUnlessTheEnvironmentSaysWhere) {
  const char* before = std::getenv("HPCTRAIN_CUDA_MODULE");
  const std::string saved = before != nullptr ? before : "";
  ::unsetenv("HPCTRAIN_CUDA_MODULE");
  const fs::path program = fs::read_symlink("/proc/self/exe");
  EXPECT_EQ(cuda_module_path(), (program.parent_path().parent_path() / "lib" / "libhpctrain_cuda.so").string());
  ::setenv("HPCTRAIN_CUDA_MODULE", "/somewhere/else.so", 1);
  EXPECT_EQ(cuda_module_path(), "/somewhere/else.so");
  ::setenv("HPCTRAIN_CUDA_MODULE", "", 1);  // empty: as if unset
  EXPECT_EQ(cuda_module_path(), (program.parent_path().parent_path() / "lib" / "libhpctrain_cuda.so").string());
  if (before != nullptr)
    ::setenv("HPCTRAIN_CUDA_MODULE", saved.c_str(), 1);
  else
    ::unsetenv("HPCTRAIN_CUDA_MODULE");
}

// ---- the module this build made ----

const CudaModuleTable* module_or_skip() {
  std::string why;
  const CudaModuleTable* module = load_cuda_module(&why);
  if (module == nullptr && contains(why, "this build has no CUDA backend")) return nullptr;
  EXPECT_NE(module, nullptr) << why;
  return module;
}

TEST(CudaModule, OpensAndIsThisBuilds) {
  const CudaModuleTable* module = module_or_skip();
  if (module == nullptr) {
    EXPECT_EQ(cuda_module_summary(), "off");
    EXPECT_EQ(cuda_device_count(), 0);
    EXPECT_THROW((void)make_cuda_backend(0), InputError);
    GTEST_SKIP() << "this build has no CUDA module";
  }
  EXPECT_EQ(module->abi, cuda_module_abi);
  EXPECT_STREQ(module->version, HPCTRAIN_VERSION);
  EXPECT_TRUE(contains(module->features, "cuBLASLt")) << module->features;
  EXPECT_EQ(load_cuda_module(nullptr), module) << "opened once per process";
  EXPECT_TRUE(contains(cuda_module_summary(), "libhpctrain_cuda.so")) << cuda_module_summary();
}

TEST(CudaModule, CountsTheDriversDevices) {
  const CudaModuleTable* module = module_or_skip();
  if (module == nullptr) GTEST_SKIP() << "this build has no CUDA module";
  // The runtime in the module and the driver the executable asks directly agree (0 and 0 without a driver).
  EXPECT_EQ(module->device_count(), cuda_device_count());
  std::string why;
  if (!cuda_driver_present(&why)) {
    EXPECT_EQ(cuda_device_count(), 0);
    EXPECT_TRUE(contains(why, "libcuda.so.1")) << why;
  }
}

TEST(CudaModule, ItsErrorsReachTheCallerByType) {
  const CudaModuleTable* module = module_or_skip();
  if (module == nullptr) GTEST_SKIP() << "this build has no CUDA module";
  if (module->device_count() > 0) {
    EXPECT_EQ(make_cuda_backend(0)->name().rfind("cuda:0", 0), 0u);
    return;
  }
  // Without a device the backend's constructor (inside the module) throws InputError: caught here by its type.
  try {
    (void)make_cuda_backend(0);
    ADD_FAILURE() << "a CUDA backend was made without a device";
  } catch (const InputError& error) {
    EXPECT_TRUE(contains(error.what(), "no CUDA device")) << error.what();
  }
}

}  // namespace
}  // namespace hpctrain
