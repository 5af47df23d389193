// Building the messages of library errors; kept out of the header so it does not pull in MPI or HDF5.
#include "hpctrain/core/error.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

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
                           const char* file, int line, int error_number)
    : Error(located(library, call, detail, file, line), ErrorScope::this_rank, {}, exit_runtime_error),
      detail_(detail),
      error_number_(error_number) {}

namespace {
std::string error_log_path;
}

void set_error_log(const std::string& path) { error_log_path = path; }

namespace {
bool unsafe_shutdown = false;
}

void mark_shutdown_unsafe() { unsafe_shutdown = true; }
bool shutdown_is_safe() { return !unsafe_shutdown; }

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
  int error_class = MPI_SUCCESS;
  MPI_Error_class(code, &error_class);
  const int error_number = error_class == MPI_ERR_NO_SPACE ? ENOSPC : error_class == MPI_ERR_QUOTA ? EDQUOT : 0;
  throw LibraryError("MPI", call, std::string(text, static_cast<size_t>(length)), file, line, error_number);
}

namespace {
struct Hdf5Stack {
  std::string detail;    // the innermost frames
  int error_number = 0;  // a system error named in any frame
};

// The errno a frame of HDF5's stack names: its POSIX driver writes "errno = 28, error message = '...'", and MPI-IO
// errors carry the system's words ("No space left on device").
int error_number_in(std::string_view description) {
  if (const auto at = description.find("errno = "); at != std::string_view::npos)
    return std::atoi(std::string(description.substr(at + 8, 6)).c_str());
  for (const int candidate : {ENOSPC, EDQUOT, EFBIG})
    if (description.find(std::strerror(candidate)) != std::string_view::npos) return candidate;
  return 0;
}

herr_t collect_hdf5_frame(unsigned n, const H5E_error2_t* frame, void* out) {
  auto* stack = static_cast<Hdf5Stack*>(out);
  if (frame->desc == nullptr) return 0;
  if (stack->error_number == 0) stack->error_number = error_number_in(frame->desc);
  // The innermost frames say what went wrong; deeper ones are noise, and a frame repeating the last adds nothing.
  if (n < 3 && !stack->detail.ends_with(frame->desc)) {
    if (!stack->detail.empty()) stack->detail += "; ";
    stack->detail += frame->desc;
  }
  return 0;
}
}  // namespace

void throw_hdf5_error(const char* call, const char* file, int line) {
  // What the failing system call left, before anything else can change it: the MPI-IO driver does not put it on
  // HDF5's stack. Only errors of writing are taken from it (a stale errno of something else would mislead).
  const int last_error = errno;
  Hdf5Stack stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_hdf5_frame, &stack);
  H5Eclear2(H5E_DEFAULT);
  if (stack.error_number == 0 && (last_error == ENOSPC || last_error == EDQUOT || last_error == EFBIG))
    stack.error_number = last_error;
  throw LibraryError("HDF5", call, stack.detail, file, line, stack.error_number);
}

void throw_internal_error(const std::string& message, const char* file, int line) {
  std::ostringstream os;
  os << message << " (at " << file << ":" << line << ")";
  throw Error(os.str(), ErrorScope::this_rank, "please report this as a bug", exit_runtime_error);
}

}  // namespace detail
}  // namespace hpctrain
