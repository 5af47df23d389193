// The command-line parser every hpctrain command uses: options with a value ("--output FILE" or "--output=FILE"),
// flags ("--force"), repeatable options ("--set k=v", each occurrence kept in order), positional arguments, and
// --help / -h. A misspelt option is an InputError with "did you mean" (core/suggestions.hpp); every message names the
// command and points at its --help.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hpctrain/app/commands.hpp"

namespace hpctrain {

struct OptionSpec {
  std::string name;          // "--samples"
  bool takes_value = false;  // false: a flag
  bool repeatable = false;   // every occurrence is kept, in order (--set)
};

class CommandLine {
 public:
  // Parses `args` (the words after the command's name) for `command` ("hpctrain data generate"). Throws InputError
  // for an unknown option, a missing value, a value given to a flag, and an option given twice that is not repeatable.
  // --help or -h anywhere wins over everything else on the line.
  CommandLine(const Arguments& args, std::string command, const std::vector<OptionSpec>& options);

  [[nodiscard]] bool help() const { return help_; }
  [[nodiscard]] const std::vector<std::string>& positionals() const { return positionals_; }
  [[nodiscard]] bool has(const std::string& option) const;
  // The value of an option given once; throws InputError ("--x is required") when it was not given.
  [[nodiscard]] const std::string& value(const std::string& option) const;
  [[nodiscard]] std::string value_or(const std::string& option, const std::string& fallback) const;
  // Every value of a repeatable option, in order (empty when not given).
  [[nodiscard]] const std::vector<std::string>& values(const std::string& option) const;
  // A value read as a whole number or a number; InputError naming the option when it is not one.
  template <class Integer>
  [[nodiscard]] Integer integer(const std::string& option) const;
  [[nodiscard]] double number(const std::string& option) const;

  [[nodiscard]] const std::string& command() const { return command_; }
  // "see 'hpctrain data generate --help'", the hint of every command-line error.
  [[nodiscard]] std::string help_hint() const { return "see '" + command_ + " --help'"; }

 private:
  std::string command_;
  std::vector<std::string> positionals_;
  std::map<std::string, std::vector<std::string>> values_;  // option -> its values ("" for a flag)
  bool help_ = false;
};

// Prints `usage` (rank 0) when the command line asks for help; returns whether it did.
bool print_help_if_asked(const CommandLine& line, const char* usage, const MpiEnvironment& mpi);

extern template std::int64_t CommandLine::integer<std::int64_t>(const std::string&) const;
extern template std::uint64_t CommandLine::integer<std::uint64_t>(const std::string&) const;

}  // namespace hpctrain
