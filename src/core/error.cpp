// Building the messages of library errors; kept out of the header so it does not pull in MPI or HDF5.
#include "hpctrain/core/error.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

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
    : Error(located(library, call, detail, file, line), ErrorScope::this_rank, {}, exit_runtime_error),
      detail_(detail) {}

namespace {
std::string error_log_path;
}

void set_error_log(const std::string& path) { error_log_path = path; }

void append_to_error_log(const std::string& text) {
  if (error_log_path.empty()) return;
  // O_APPEND: several ranks may append a line each without overwriting one another.
  const int descriptor = open(error_log_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (descriptor < 0) return;
  const ssize_t written = write(descriptor, text.data(), text.size());
  (void)written;  // on the error path: nothing more to do if the log cannot take it
  close(descriptor);
}

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
  // The innermost frames say what went wrong; deeper ones are noise, and a frame repeating the last adds nothing.
  if (n < 3 && frame->desc != nullptr && !text->ends_with(frame->desc)) {
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
