// Checks on files the user names; atomic replacement; why a write failed.
#include "hpctrain/core/files.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

void require_regular_file(const std::string& path, std::string_view description) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) {
    const fs::path cwd = fs::current_path(error);
    throw InputError(std::string(description) + " '" + path + "' does not exist",
                     fs::path(path).is_relative() && !error
                         ? "relative paths are taken from the working directory, " + cwd.string()
                         : std::string());
  }
  HPCTRAIN_VERIFY(!fs::is_directory(status), InputError, description << " '" << path << "' is a directory, not a file");
  const char* kind = fs::is_fifo(status)             ? "a named pipe (FIFO)"
                     : fs::is_character_file(status) ? "a character device"
                     : fs::is_block_file(status)     ? "a block device"
                     : fs::is_socket(status)         ? "a socket"
                                                     : nullptr;
  HPCTRAIN_VERIFY(kind == nullptr && fs::is_regular_file(status), InputError,
                  description << " '" << path << "' is " << (kind ? kind : "not a regular file")
                              << "; hpctrain reads only regular files (reading this one could block forever)",
                  "write the data to a regular file first");
  HPCTRAIN_VERIFY(access(path.c_str(), R_OK) == 0, InputError, description << " '" << path << "' cannot be read",
                  "check the file's permissions");
}

fs::path partial_path(const fs::path& destination) { return fs::path(destination.string() + ".partial"); }

namespace {

fs::path directory_of(const fs::path& file) { return file.has_parent_path() ? file.parent_path() : fs::path("."); }

// An Error saying what failed on `path` and why (errno), with the reason a user can act on for a full disk.
[[noreturn]] void throw_file_error(const std::string& what, const fs::path& path, int error_number) {
  throw Error(what + " '" + path.string() +
                  "' failed: " + write_failure_reason(error_number, std::strerror(error_number), path, 0, ""),
              ErrorScope::this_rank, "check the file system of " + directory_of(path).string());
}

}  // namespace

void fsync_path(const fs::path& path, bool directory) {
  const int descriptor = open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY | O_CLOEXEC : O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) throw_file_error("opening", path, errno);
  const int status = fsync(descriptor);
  const int error_number = errno;
  close(descriptor);
  if (status != 0) throw_file_error("flushing to disk (fsync)", path, error_number);
}

namespace {

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw_file_error("writing", path, errno != 0 ? errno : EIO);
}

}  // namespace

void commit_file(const fs::path& temporary, const fs::path& destination,
                 const std::vector<std::pair<fs::path, std::string>>& companions) {
  std::vector<std::pair<fs::path, fs::path>> renames = {{temporary, destination}};
  try {
    for (const auto& [companion, text] : companions) {
      renames.emplace_back(partial_path(companion), companion);
      write_text_file(renames.back().first, text);
    }
    for (const auto& rename : renames) fsync_path(rename.first, false);
    for (const auto& [from, to] : renames)
      if (std::rename(from.c_str(), to.c_str()) != 0) throw_file_error("renaming", from, errno);
    fsync_path(directory_of(destination), true);  // one flush makes every rename durable
  } catch (...) {
    std::error_code ignored;
    for (const auto& rename : renames) fs::remove(rename.first, ignored);  // those not renamed yet
    throw;
  }
}

void write_file_atomically(const fs::path& destination, const std::function<void(const std::string&)>& write,
                           const fs::path& temporary) {
  const fs::path written = temporary.empty() ? partial_path(destination) : temporary;
  try {
    write(written.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove(written, ignored);
    throw;
  }
  commit_file(written, destination);
}

void write_text_file_atomically(const fs::path& destination, const std::string& text, const fs::path& temporary) {
  write_file_atomically(
      destination, [&](const std::string& path) { write_text_file(path, text); }, temporary);
}

std::string write_failure_reason(int error_number, const std::string& detail, const fs::path& file,
                                 std::uintmax_t needed_bytes, std::string_view needed_by) {
  const fs::path directory = directory_of(file);
  struct statvfs space {};
  const bool have_space = statvfs(directory.c_str(), &space) == 0;
  const std::uintmax_t free_bytes =
      have_space ? static_cast<std::uintmax_t>(space.f_bavail) * static_cast<std::uintmax_t>(space.f_frsize) : 0;
  rlimit file_size{};
  const bool limited = getrlimit(RLIMIT_FSIZE, &file_size) == 0 && file_size.rlim_cur != RLIM_INFINITY;
  if (error_number == 0 && needed_bytes > 0) {  // nothing reported: what the file system and the limits say
    if (have_space && free_bytes < needed_bytes)
      error_number = ENOSPC;
    else if (limited && file_size.rlim_cur < needed_bytes)
      error_number = EFBIG;
  }
  const std::string need =
      needed_bytes > 0 ? std::string(needed_by) + " needs about " + byte_size_text(needed_bytes) : std::string();
  switch (error_number) {
    case ENOSPC:
      return "the file system is full (" +
             (have_space ? byte_size_text(free_bytes) + " free in " + directory.string() : directory.string()) +
             (need.empty() ? "" : "; " + need) + ")";
    case EDQUOT:
      return "the disk quota for " + directory.string() + " is exceeded" + (need.empty() ? "" : " (" + need + ")");
    case EFBIG:
      return "the file would pass the file-size limit (ulimit -f)" +
             (limited ? " of " + byte_size_text(file_size.rlim_cur) : std::string()) +
             (need.empty() ? "" : " (" + need + ")");
    default:
      return detail.empty() && error_number != 0 ? std::strerror(error_number) : detail;
  }
}

}  // namespace hpctrain
