// The status file job scripts read instead of the launcher's exit status.
#include "hpctrain/train/run_status.hpp"

#include <unistd.h>

#include <cstdio>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"

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
    try {
      // The process id in the temporary name: a rank reporting its own error may write while rank 0 does.
      write_text_file_atomically(file, line + '\n', file.string() + ".tmp" + std::to_string(getpid()));
    } catch (const Error& error) {
      std::fprintf(stderr, "hpctrain: warning: cannot write '%s' to the status file '%s': %s\n", line.c_str(),
                   file.c_str(), error.what());
    }
  }
}

}  // namespace hpctrain
