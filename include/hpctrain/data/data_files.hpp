// The files of one data split: data.train / data.validation name one file, a list of files, or glob patterns, and the
// split is their concatenation in the order given (each pattern's matches sorted by name).
#pragma once

#include <string>
#include <vector>

namespace hpctrain {

// Whether text contains a glob wildcard (*, ? or [).
bool is_glob_pattern(const std::string& text);

// Expands each pattern with glob(3) (sorted matches) and keeps plain names as they are (a missing one is reported when
// it is opened). Throws InputError naming `where` and `key` for a pattern that matches nothing, or an empty list.
std::vector<std::string> expand_data_files(const std::vector<std::string>& patterns, const std::string& where,
                                           const std::string& key);

// "a.h5", or "a.h5 (and 3 more files)" for messages about a whole split.
std::string describe_files(const std::vector<std::string>& files);

}  // namespace hpctrain
