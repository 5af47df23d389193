// Glob expansion of data.train / data.validation.
#include "hpctrain/data/data_files.hpp"

#include <glob.h>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

bool is_glob_pattern(const std::string& text) { return text.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> expand_data_files(const std::vector<std::string>& patterns, const std::string& where,
                                           const std::string& key) {
  HPCTRAIN_VERIFY(!patterns.empty(), InputError, where << ": " << key << " names no file",
                  "give a file, a list of files or a glob pattern, e.g. " + key + " = \"data/train_*.h5\"");
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    HPCTRAIN_VERIFY(!pattern.empty(), InputError, where << ": " << key << " contains an empty file name",
                    "remove the empty entry");
    if (!is_glob_pattern(pattern)) {
      files.push_back(pattern);
      continue;
    }
    glob_t matches{};
    const int status = glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
    std::vector<std::string> found;
    if (status == 0)
      for (std::size_t i = 0; i < matches.gl_pathc; ++i) found.emplace_back(matches.gl_pathv[i]);
    globfree(&matches);
    HPCTRAIN_VERIFY(status == 0 || status == GLOB_NOMATCH, InputError,
                    where << ": " << key << ": cannot list the files matching '" << pattern << "' (a directory on the "
                          << "way is unreadable)");
    HPCTRAIN_VERIFY(!found.empty(), InputError,
                    where << ": " << key << ": the pattern '" << pattern << "' matches no file",
                    "check the directory and the pattern; relative patterns are resolved like data paths (see "
                    "docs/input-reference.md)");
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string describe_files(const std::vector<std::string>& files) {
  if (files.empty()) return "(no file)";
  if (files.size() == 1) return files.front();
  return files.front() + " (and " + std::to_string(files.size() - 1) + " more file" + (files.size() > 2 ? "s" : "") +
         ")";
}

}  // namespace hpctrain
