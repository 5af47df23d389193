// What the `hpctrain data` sub-commands share: their entry points, writing an output file safely, and the waiting of
// the ranks that do not work.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hpctrain/app/commands.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain {

class CommandLine;
struct RunConfig;

int data_generate_command(const Arguments& args, const MpiEnvironment& mpi);
int data_inspect_command(const Arguments& args, const MpiEnvironment& mpi);
int data_convert_command(const Arguments& args, const MpiEnvironment& mpi);
int data_split_command(const Arguments& args, const MpiEnvironment& mpi);
int data_plan_command(const Arguments& args, const MpiEnvironment& mpi);
int data_bench_command(const Arguments& args, const MpiEnvironment& mpi);

// The other ranks wait here while rank 0 works; if it fails it ends the job (MPI_Abort), so nobody waits for long.
void wait_for_root(const MpiEnvironment& mpi);

// Writes `output` (the value of `option`) with write(temporary) and commits it (core/files.hpp
// write_file_atomically), so that a crash or a full disk never leaves a half-written file under the name a deck points
// at. Checks first that the directory exists and that `output` does not (unless --force).
void write_output_file(const CommandLine& line, const std::string& option, const std::string& output,
                       const std::function<void(const std::string& temporary)>& write);

// predict, evaluate and generate, before they compute: `path` may be written (it does not exist, unless force; its
// directory is writable). Checked on rank 0; InputError on every rank otherwise.
void refuse_to_overwrite(const std::string& path, bool force, const MpiEnvironment& mpi);

// The --set override of an inference command's --device cpu|cuda|auto ("run.device=cuda"); InputError for another
// value.
std::string device_override(const CommandLine& line);

// A summary written about temporary files, naming the outputs instead ("a.h5.partial" -> "a.h5").
std::string naming_outputs(std::string summary, const std::vector<std::string>& outputs);

// Every error of a data tool names the command: "hpctrain data convert: 'x.npy' is ...".
template <class Action>
auto with_command_context(const std::string& command, Action&& action) {
  try {
    return action();
  } catch (const InputError& error) {
    throw InputError(command + ": " + error.what(), error.hint(), error.scope());
  }
}

}  // namespace hpctrain
