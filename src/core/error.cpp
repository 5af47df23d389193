// Building the messages of library errors; kept out of the header so it does not pull in MPI or HDF5.
#include "hpctrain/core/error.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <cstdio>

namespace hpctrain {

namespace {
std::string located(const std::string& library, const std::string& call, const std::string& detail, const char* file,
                    int line) {
  std::ostringstream os;
  os << library << " call failed: " << call;
  if (!detail.empty()) os << ": " << detail;
  os << " (at " << file << ":" << line << ")";
  return os.str();
}
}  // namespace

LibraryError::LibraryError(const std::string& library, const std::string& call, const std::string& detail,
                           const char* file, int line)
    : Error(located(library, call, detail, file, line), ErrorScope::this_rank, {}, exit_runtime_error) {}

namespace detail {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw LibraryError("MPI", call, std::string(text, static_cast<size_t>(length)), file, line);
}

namespace {
herr_t collect_hdf5_frame(unsigned n, const H5E_error2_t* frame, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (n < 3 && frame->desc != nullptr) {  // the innermost frames say what went wrong; deeper ones are noise
    if (!text->empty()) *text += "; ";
    *text += frame->desc;
  }
  return 0;
}
}  // namespace

void throw_hdf5_error(const char* call, const char* file, int line) {
  std::string detail;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_hdf5_frame, &detail);
  H5Eclear2(H5E_DEFAULT);
  throw LibraryError("HDF5", call, detail, file, line);
}

void throw_internal_error(const std::string& message, const char* file, int line) {
  std::ostringstream os;
  os << message << " (at " << file << ":" << line << ")";
  throw Error(os.str(), ErrorScope::this_rank, "please report this as a bug", exit_runtime_error);
}

}  // namespace detail
}  // namespace hpctrain
