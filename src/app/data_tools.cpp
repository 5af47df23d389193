// Shared pieces of the data sub-commands.
#include "data_tools.hpp"

#include <unistd.h>

#include <filesystem>

#include "hpctrain/app/command_line.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

void wait_for_root(const MpiEnvironment& mpi) {
  if (mpi.size() > 1) HPCTRAIN_MPI_CHECK(MPI_Barrier(mpi.world()));
}

void write_output_file(const CommandLine& line, const std::string& option, const std::string& output,
                       const std::function<void(const std::string&)>& write) {
  namespace fs = std::filesystem;
  const std::string& command = line.command();
  HPCTRAIN_VERIFY(!output.empty(), InputError, command << ": " << option << " is empty", line.help_hint());
  const fs::path output_path(output);
  const fs::path directory = output_path.has_parent_path() ? output_path.parent_path() : fs::path(".");
  HPCTRAIN_VERIFY(fs::is_directory(directory), InputError,
                  command << ": the directory of " << option << ", '" << directory.string() << "', does not exist",
                  "create it first (mkdir -p " + directory.string() + ")");
  HPCTRAIN_VERIFY(!fs::is_directory(output_path), InputError,
                  command << ": " << option << " '" << output << "' is a directory",
                  "name a file, e.g. " + output + "/data.h5");
  HPCTRAIN_VERIFY(!fs::exists(output_path) || line.has("--force"), InputError,
                  command << ": '" << output << "' already exists",
                  "pass --force to replace it, or choose another " + option);
  write_file_atomically(output_path, write);
}

void refuse_to_overwrite(const std::string& path, bool force, const MpiEnvironment& mpi) {
  namespace fs = std::filesystem;
  run_on_root(mpi, [&] {
    if (!force && fs::exists(path))
      throw InputError("'" + path + "' exists; hpctrain does not overwrite results",
                       "pass --force or another --output");
    const fs::path directory = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
    if (!fs::is_directory(directory) || access(directory.c_str(), W_OK) != 0)
      throw InputError("cannot create '" + path + "': '" + directory.string() + "' is not a writable directory",
                       "choose a writable --output");
  });
}

std::string device_override(const CommandLine& line) {
  const std::string& device = line.value("--device");
  HPCTRAIN_VERIFY(device == "cpu" || device == "cuda" || device == "auto", InputError,
                  line.command() << ": --device " << device << " is not one of cpu, cuda, auto", line.help_hint());
  return "run.device=" + device;
}

std::string naming_outputs(std::string summary, const std::vector<std::string>& outputs) {
  for (const std::string& output : outputs) {
    const std::string partial = partial_path(output).string();
    if (const auto at = summary.find(partial); at != std::string::npos) summary.replace(at, partial.size(), output);
  }
  return summary;
}

}  // namespace hpctrain
