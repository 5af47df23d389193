// The executable's side of the CUDA backend: finding and opening the CUDA module (kernels/cuda_module.hpp), and the
// CUDA entry points every build links (make_cuda_backend forwards to the module; cuda_device_count asks the driver).
// Nothing here includes a CUDA header or links a CUDA library.
#include "hpctrain/kernels/cuda_module.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <filesystem>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"

// Set for this file by cmake/HpctrainCuda.cmake: whether the build made the module, and where it lies relative to
// the executable's folder.
#if !defined(HPCTRAIN_CUDA_MODULE_BUILT) || !defined(HPCTRAIN_CUDA_MODULE_RELATIVE_PATH)
#error "HPCTRAIN_CUDA_MODULE_BUILT and HPCTRAIN_CUDA_MODULE_RELATIVE_PATH come from cmake/HpctrainCuda.cmake"
#endif

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

// The program's interpreter (its PT_INTERP: the dynamic loader), empty when it has none.
std::string interpreter() {
  std::string path;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        for (int i = 0; i < info->dlpi_phnum; ++i)
          if (info->dlpi_phdr[i].p_type == PT_INTERP)
            *static_cast<std::string*>(out) =
                reinterpret_cast<const char*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        return 1;  // the first object, the program, only
      },
      &path);
  return path;
}

// The running program's file: /proc/self/exe, unless that is the dynamic loader, which it is when the program was
// started through it (`ld.so --inhibit-cache PROGRAM`, as tests/cli/cuda_module.sh does to hide libraries); then the
// loader's name for the program (dladdr of a function in it: the path it was given).
fs::path program_path() {
  std::error_code error;
  const fs::path executable = fs::read_symlink("/proc/self/exe", error);
  if (error) return {};
  const std::string loader = interpreter();
  std::error_code not_equivalent;
  if (loader.empty() || !fs::equivalent(executable, loader, not_equivalent)) return executable;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&interpreter), &info) == 0 || info.dli_fname == nullptr) return {};
  return fs::absolute(info.dli_fname, error);
}

struct OpenedModule {
  const CudaModuleTable* table = nullptr;
  std::string why;  // when table is nullptr
};

OpenedModule open_this_builds_module() {
  if (!HPCTRAIN_CUDA_MODULE_BUILT)
    return {nullptr,
            "this build has no CUDA backend (configured with HPCTRAIN_CUDA=OFF or without nvcc); rebuild "
            "with -DHPCTRAIN_CUDA=ON"};
  OpenedModule opened;
  opened.table = open_cuda_module(cuda_module_path(), &opened.why);
  return opened;
}

void* open_driver(std::string* why) {
  // The driver's soname is libcuda.so.1 on every Linux driver release; RTLD_LOCAL keeps its symbols to itself.
  static void* const driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  static const std::string failure = driver != nullptr ? std::string() : std::string(dlerror());
  if (driver == nullptr && why != nullptr) *why = "no CUDA driver: " + failure;
  return driver;
}

}  // namespace

std::string cuda_module_path() {
  if (const char* path = std::getenv("HPCTRAIN_CUDA_MODULE"); path != nullptr && *path != '\0') return path;
  const fs::path executable = program_path();
  if (executable.empty()) return HPCTRAIN_CUDA_MODULE_RELATIVE_PATH;
  return (executable.parent_path() / HPCTRAIN_CUDA_MODULE_RELATIVE_PATH).lexically_normal().string();
}

const CudaModuleTable* open_cuda_module(const std::string& path, std::string* why) {
  const auto refuse = [&](const std::string& text) -> const CudaModuleTable* {
    if (why != nullptr) *why = path + text;
    return nullptr;
  };
  std::error_code error;
  if (!fs::exists(path, error))
    return refuse(" is missing: install it with the executable, or point HPCTRAIN_CUDA_MODULE at it");
  // RTLD_NOW: a library or symbol the module lacks is named here, not at a first call in the middle of set-up.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const std::string text = dlerror();  // "PATH: LIBRARY: cannot open shared object file ..." or the symbol lacked
    return refuse(text.rfind(path + ": ", 0) == 0 ? text.substr(path.size()) : ": " + text);
  }
  using Entry = const CudaModuleTable* (*)();
  const auto entry = reinterpret_cast<Entry>(dlsym(handle, "hpctrain_cuda_module"));
  const CudaModuleTable* table = entry != nullptr ? entry() : nullptr;
  if (table == nullptr || table->abi != cuda_module_abi || std::string(table->version) != HPCTRAIN_VERSION) {
    dlclose(handle);
    if (entry == nullptr) return refuse(" is not an hpctrain CUDA module (no hpctrain_cuda_module symbol)");
    return refuse(std::string(" belongs to another build of hpctrain (this one is ") + HPCTRAIN_VERSION +
                  "): install the module built with this executable");
  }
  return table;  // never closed: backends and exchanges made by it live until the process ends
}

const CudaModuleTable* load_cuda_module(std::string* why) {
  static const OpenedModule opened = open_this_builds_module();  // once per process, thread-safe
  if (opened.table == nullptr && why != nullptr) *why = opened.why;
  return opened.table;
}

bool cuda_driver_present(std::string* why) { return open_driver(why) != nullptr; }

int cuda_device_count() {
  if (!HPCTRAIN_CUDA_MODULE_BUILT) return 0;
  void* driver = open_driver(nullptr);
  if (driver == nullptr) return 0;
  // The driver API's C functions (cuda.h is not included: the executable is built without CUDA headers too).
  // CUresult is an int enum with CUDA_SUCCESS = 0.
  using Init = int (*)(unsigned int flags);
  using DeviceGetCount = int (*)(int* count);
  const auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
  const auto device_get_count = reinterpret_cast<DeviceGetCount>(dlsym(driver, "cuDeviceGetCount"));
  int count = 0;
  if (init == nullptr || device_get_count == nullptr || init(0) != 0 || device_get_count(&count) != 0) return 0;
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  const CudaModuleTable* module = load_cuda_module(&why);
  if (module == nullptr) throw InputError("the CUDA backend is not available: " + why, {}, ErrorScope::this_rank);
  return module->make_backend(device);
}

std::string cuda_module_summary() {
  if (!HPCTRAIN_CUDA_MODULE_BUILT) return "off";
  std::string why;
  const CudaModuleTable* module = load_cuda_module(&why);
  if (module == nullptr) return "unusable: " + why;
  return "module " + cuda_module_path() + " (" + module->features + "), " + std::to_string(module->device_count()) +
         " device(s) visible";
}

}  // namespace hpctrain
