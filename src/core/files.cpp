// Checks on files the user names.
#include "hpctrain/core/files.hpp"

#include <unistd.h>

#include <filesystem>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

void require_regular_file(const std::string& path, std::string_view description) {
  namespace fs = std::filesystem;
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

}  // namespace hpctrain
