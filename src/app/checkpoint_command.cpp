// `hpctrain checkpoint verify FILE|RUN_DIR`: check a checkpoint's layout and every dataset's CRC-32 (rank 0 only).
#include <cstdio>
#include <filesystem>

#include "hpctrain/app/command_line.hpp"
#include "hpctrain/app/commands.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/checkpoint.hpp"

namespace hpctrain {

namespace {
const char* const checkpoint_usage =
    "usage: hpctrain checkpoint verify FILE.h5|RUN_DIR\n"
    "\n"
    "Check a checkpoint: its format and the CRC-32 of every dataset. With a run directory, check the checkpoint that\n"
    "RUN_DIR/checkpoints/latest names. Exit status 0 when sound, 1 when damaged, 2 when there is no such checkpoint.\n";
}

int checkpoint_command(const Arguments& args, const MpiEnvironment& mpi) {
  if (args.empty()) {
    if (mpi.is_root()) std::fputs(checkpoint_usage, stderr);
    return exit_input_error;
  }
  const CommandLine line(args, "hpctrain checkpoint", {});
  if (print_help_if_asked(line, checkpoint_usage, mpi)) return 0;
  const auto& words = line.positionals();
  HPCTRAIN_VERIFY(words.size() == 2 && words[0] == "verify", InputError,
                  "hpctrain checkpoint: expected 'verify FILE|RUN_DIR'", line.help_hint());
  namespace fs = std::filesystem;
  const fs::path path = resolve_checkpoint(words[1]);
  std::error_code error;
  HPCTRAIN_VERIFY(fs::is_regular_file(path, error), InputError,
                  "hpctrain checkpoint verify: '" << path.string() << "' does not exist or is not a file",
                  "pass a checkpoint file (RUN/checkpoints/step-NNNNNNNN.h5) or a run directory");
  if (!mpi.is_root()) return 0;
  const std::string problem = verify_checkpoint(path.string());
  if (problem.empty()) {
    std::printf("%s: ok\n", path.string().c_str());
    return 0;
  }
  std::printf("%s: DAMAGED: %s\n", path.string().c_str(), problem.c_str());
  return 1;
}

}  // namespace hpctrain
