// `hpctrain --version`: version and the facts of this build and its libraries.
#include <hdf5.h>
#include <mpi.h>

#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "hpctrain/app/commands.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/kernels/cuda_module.hpp"

namespace hpctrain {

int version_command(const MpiEnvironment& mpi) {
  if (!mpi.is_root()) return 0;
  char mpi_library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  HPCTRAIN_MPI_CHECK(MPI_Get_library_version(mpi_library, &length));
  std::string mpi_text(mpi_library, static_cast<std::size_t>(length));
  if (auto comma = mpi_text.find_first_of(",\n"); comma != std::string::npos) mpi_text.resize(comma);
  int mpi_major = 0, mpi_minor = 0;
  HPCTRAIN_MPI_CHECK(MPI_Get_version(&mpi_major, &mpi_minor));
  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  HPCTRAIN_H5_CHECK(H5get_libversion(&h5_major, &h5_minor, &h5_release));
#ifdef H5_HAVE_PARALLEL
  const char* h5_parallel = "parallel";
#else
  const char* h5_parallel = "serial";
#endif
  const dnnl_version_t* dnnl = dnnl_version();
  const std::string cuda = cuda_module_summary();  // opens the module: whether it loads is what this line tells
  std::printf("hpctrain %s\n", HPCTRAIN_VERSION);
  std::printf("  compiler: %s %s, C++ %ld\n",
#if defined(__clang__)
              "clang",
#else
              "g++",
#endif
              __VERSION__, static_cast<long>(__cplusplus));
  std::printf("  MPI:      %s (MPI %d.%d)\n", mpi_text.c_str(), mpi_major, mpi_minor);
  std::printf("  HDF5:     %u.%u.%u (%s)\n", h5_major, h5_minor, h5_release, h5_parallel);
  std::printf("  oneDNN:   %d.%d.%d\n", dnnl->major, dnnl->minor, dnnl->patch);
  std::printf("  CUDA:     %s\n", cuda.c_str());
  return 0;
}

}  // namespace hpctrain
