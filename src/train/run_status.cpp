// The status file job scripts read instead of the launcher's exit status.
#include "hpctrain/train/run_status.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace hpctrain {

namespace fs = std::filesystem;

RunStatus::RunStatus(const std::string& status_file) {
  if (!status_file.empty()) files_.emplace_back(status_file);
}

void RunStatus::write(const std::string& state, int exit_code, std::int64_t step) {
  step_ = step;
  const std::string line =
      state + " " + (exit_code < 0 ? std::string("-") : std::to_string(exit_code)) + " step " + std::to_string(step);
  for (const fs::path& file : files_) {
    // The process id in the temporary name: a rank reporting its own error may write while rank 0 does.
    const fs::path temporary = file.string() + ".tmp" + std::to_string(getpid());
    std::error_code error;
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << line << '\n';
      out.close();
      if (!out) error = std::make_error_code(std::errc::io_error);
    }
    if (!error) fs::rename(temporary, file, error);
    if (error) {
      std::fprintf(stderr, "hpctrain: warning: cannot write '%s' to the status file '%s': %s\n", line.c_str(),
                   file.c_str(), error.message().c_str());
      fs::remove(temporary, error);
    }
  }
}

}  // namespace hpctrain
