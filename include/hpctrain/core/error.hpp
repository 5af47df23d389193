// Typed errors and the one family of check macros used everywhere.
//
// User-facing errors (bad deck, bad data) carry the input's location inside the message. Library failures (MPI, HDF5,
// CUDA, ...) carry the source location of the failing call. Errors are thrown, caught once in main, printed by the rank
// that saw them (rank 0 only when every rank sees the same one), and end every rank with MPI_Abort.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace hpctrain {

// Which part of the world knows about an error decides who prints it.
enum class ErrorScope {
  all_ranks,  // every rank detects the same error deterministically (deck, sizes): rank 0 prints once
  this_rank,  // only this rank saw it (its share of the data, its file system): this rank prints
};

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, ErrorScope scope = ErrorScope::this_rank, std::string hint = {},
        int exit_code = 1)
      : std::runtime_error(message), scope_(scope), hint_(std::move(hint)), exit_code_(exit_code) {}
  [[nodiscard]] ErrorScope scope() const { return scope_; }
  [[nodiscard]] const std::string& hint() const { return hint_; }
  [[nodiscard]] int exit_code() const { return exit_code_; }

 private:
  ErrorScope scope_;
  std::string hint_;
  int exit_code_;
};

// Exit codes documented in docs/troubleshooting.md.
inline constexpr int exit_input_error = 2;    // bad deck, bad data, bad command line
inline constexpr int exit_runtime_error = 1;  // library failure, numerical blow-up

// A problem with what the user gave us: deck, command line, data files. Same on every rank by default.
class InputError : public Error {
 public:
  explicit InputError(const std::string& message, std::string hint = {}, ErrorScope scope = ErrorScope::all_ranks)
      : Error(message, scope, std::move(hint), exit_input_error) {}
};

// A failing library call (MPI, HDF5, oneDNN, CUDA, cuBLAS, cuDNN, NCCL) or system call.
class LibraryError : public Error {
 public:
  LibraryError(const std::string& library, const std::string& call, const std::string& detail, const char* file,
               int line, int error_number = 0);
  // What the library said, without the call and source location (for messages about the user's file).
  [[nodiscard]] const std::string& detail() const { return detail_; }
  // The system error behind a failed write or read, when the library passed it on (ENOSPC, EDQUOT, EFBIG, ...); 0 when
  // unknown. Lets a caller say "the file system is full" instead of the library's words.
  [[nodiscard]] int error_number() const { return error_number_; }

 private:
  std::string detail_;
  int error_number_ = 0;
};

// Training went numerically wrong (NaN loss, collapsed loss scale). Every rank sees it (values are all-reduced).
class NumericsError : public Error {
 public:
  explicit NumericsError(const std::string& message, std::string hint = {})
      : Error(message, ErrorScope::all_ranks, std::move(hint), exit_runtime_error) {}
};

// A feature that is deliberately not there yet.
class NotSupported : public Error {
 public:
  explicit NotSupported(const std::string& message, ErrorScope scope = ErrorScope::all_ranks)
      : Error(message + " (not supported yet)", scope, {}, exit_input_error) {}
};

// train.log, once a run has opened it: the error path appends the printed message there as well, so the log holds
// everything the run printed. Thread-unsafe by design (set once at start-up).
void set_error_log(const std::string& path);
void append_to_error_log(const std::string& text);

// A library holds state that its own shutdown would trip over (an HDF5 file whose close failed after a failed write:
// HDF5 1.10 then keeps a dangling identifier and crashes closing it in MPI_Finalize). The error path then ends the
// job with MPI_Abort instead of MPI_Finalize.
void mark_shutdown_unsafe();
[[nodiscard]] bool shutdown_is_safe();

namespace detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_hdf5_error(const char* call, const char* file, int line);
[[noreturn]] void throw_internal_error(const std::string& message, const char* file, int line);
}  // namespace detail

}  // namespace hpctrain

// HPCTRAIN_VERIFY(cond, ErrorType, "message " << value [, extra ctor args]): throw ErrorType(message) unless cond.
#define HPCTRAIN_VERIFY(cond, ErrorType, stream_expr, ...)   \
  do {                                                       \
    if (!(cond)) {                                           \
      std::ostringstream hpctrain_verify_os_;                \
      hpctrain_verify_os_ << stream_expr;                    \
      throw ErrorType(hpctrain_verify_os_.str(), ##__VA_ARGS__); \
    }                                                        \
  } while (false)

// Programming errors (broken invariants), reported with the source location.
#define HPCTRAIN_ASSERT(cond, stream_expr)                                                      \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::ostringstream hpctrain_assert_os_;                                                   \
      hpctrain_assert_os_ << "internal error: " << #cond << ": " << stream_expr;                \
      ::hpctrain::detail::throw_internal_error(hpctrain_assert_os_.str(), __FILE__, __LINE__);  \
    }                                                                                           \
  } while (false)

#define HPCTRAIN_MPI_CHECK(call)                                                  \
  do {                                                                            \
    const int hpctrain_mpi_rc_ = (call);                                          \
    if (hpctrain_mpi_rc_ != 0 /* MPI_SUCCESS */)                                  \
      ::hpctrain::detail::throw_mpi_error(hpctrain_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (false)

// HDF5 calls return a negative herr_t or hid_t on failure; the HDF5 error stack is captured into the message.
#define HPCTRAIN_H5_CHECK(call)                                                 \
  ([&]() {                                                                      \
    auto hpctrain_h5_rc_ = (call);                                              \
    if (hpctrain_h5_rc_ < 0) ::hpctrain::detail::throw_hdf5_error(#call, __FILE__, __LINE__); \
    return hpctrain_h5_rc_;                                                     \
  }())
