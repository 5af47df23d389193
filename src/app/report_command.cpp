// `hpctrain report RUN_DIR... [--plot OUT.png] [--csv [FILE]]`: the run summaries, curves plot and CSV export of
// tools/hpctrain_report.py, found next to the executable. A serial command that needs no MPI: main() hands over to it before MPI starts, and it replaces
// this process with python3, so the script's own exit status and messages reach the user unchanged.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "hpctrain/app/commands.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain {
namespace {

namespace fs = std::filesystem;

// Where the script is: $HPCTRAIN_REPORT_SCRIPT if set; else an installed tree (bin/../share/hpctrain/), then the
// source tree this executable was built from.
fs::path find_report_script() {
  std::vector<fs::path> candidates;
  std::error_code error;
  if (const char* explicit_path = std::getenv("HPCTRAIN_REPORT_SCRIPT")) {
    HPCTRAIN_VERIFY(
        fs::is_regular_file(explicit_path, error), InputError,
        "hpctrain report: HPCTRAIN_REPORT_SCRIPT=" << explicit_path << " is not a file",
        "point it at hpctrain_report.py (tools/ in the sources, share/hpctrain/ when installed) or unset it",
        ErrorScope::this_rank);
    return explicit_path;
  }
  const fs::path executable = fs::read_symlink("/proc/self/exe", error);
  if (!error) candidates.push_back(executable.parent_path().parent_path() / "share/hpctrain/hpctrain_report.py");
  candidates.push_back(fs::path(HPCTRAIN_SOURCE_DIR) / "tools/hpctrain_report.py");
  for (const fs::path& candidate : candidates)
    if (fs::is_regular_file(candidate, error)) return candidate;
  std::string searched;
  for (const fs::path& candidate : candidates) searched += "\n  " + candidate.string();
  throw InputError("hpctrain report: cannot find hpctrain_report.py; looked in:" + searched,
                   "set HPCTRAIN_REPORT_SCRIPT to the script's path (it is tools/hpctrain_report.py in the sources)",
                   ErrorScope::this_rank);
}

// The interpreter: $HPCTRAIN_PYTHON; else Debian's /usr/bin/python3, which has the python3-h5py, -numpy and
// -matplotlib packages even when a pyenv or conda python3 comes first on PATH; else python3 from PATH.
std::string python_interpreter() {
  if (const char* chosen = std::getenv("HPCTRAIN_PYTHON")) return chosen;
  std::error_code error;
  return fs::exists("/usr/bin/python3", error) ? "/usr/bin/python3" : "python3";
}

}  // namespace

int report_command(const Arguments& args) {
  const std::string script = find_report_script().string();
  std::string python = python_interpreter();
  std::vector<std::string> words{python, script};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execvp(python.c_str(), argv.data());
  throw InputError(
      "hpctrain report: cannot run " + python + ": " + std::strerror(errno),
      "install python3 with h5py, numpy and matplotlib (tools/install-deps.sh does), or set HPCTRAIN_PYTHON",
      ErrorScope::this_rank);
}

}  // namespace hpctrain
