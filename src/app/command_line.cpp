// The one command-line parser of the hpctrain commands.
#include "hpctrain/app/command_line.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/suggestions.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

CommandLine::CommandLine(const Arguments& args, std::string command, const std::vector<OptionSpec>& options)
    : command_(std::move(command)) {
  if (std::any_of(args.begin(), args.end(), [](const std::string& arg) { return arg == "--help" || arg == "-h"; })) {
    help_ = true;
    return;
  }
  const std::string hint = help_hint();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!arg.starts_with("-") || arg == "-") {
      positionals_.push_back(arg);
      continue;
    }
    const std::size_t equals = arg.find('=');
    const std::string name = arg.substr(0, equals);
    const auto spec = std::find_if(options.begin(), options.end(), [&](const OptionSpec& o) { return o.name == name; });
    if (spec == options.end()) {
      std::vector<Suggestion> candidates;
      for (const OptionSpec& candidate : options) candidates.push_back({candidate.name, candidate.name});
      const auto suggestion = closest_name(name, candidates);
      throw InputError(command_ + ": unknown option '" + name + "'",
                       suggestion ? "did you mean '" + *suggestion + "'? " + hint : hint);
    }
    HPCTRAIN_VERIFY(spec->repeatable || !has(name), InputError, command_ << ": " << name << " given twice", hint);
    std::string value;
    if (!spec->takes_value) {
      HPCTRAIN_VERIFY(equals == std::string::npos, InputError, command_ << ": " << name << " takes no value", hint);
    } else if (equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else {
      HPCTRAIN_VERIFY(i + 1 < args.size(), InputError, command_ << ": " << name << " needs a value", hint);
      value = args[++i];
    }
    values_[name].push_back(std::move(value));
  }
}

bool CommandLine::has(const std::string& option) const { return values_.contains(option); }

const std::string& CommandLine::value(const std::string& option) const {
  HPCTRAIN_VERIFY(has(option), InputError, command_ << ": " << option << " is required", help_hint());
  return values_.at(option).front();
}

std::string CommandLine::value_or(const std::string& option, const std::string& fallback) const {
  return has(option) ? value(option) : fallback;
}

const std::vector<std::string>& CommandLine::values(const std::string& option) const {
  static const std::vector<std::string> none;
  const auto found = values_.find(option);
  return found == values_.end() ? none : found->second;
}

template <class Integer>
Integer CommandLine::integer(const std::string& option) const {
  const std::string& text = value(option);
  Integer parsed{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  HPCTRAIN_VERIFY(error == std::errc() && end == text.data() + text.size() && !text.empty(), InputError,
                  command_ << ": " << option << " expects a whole number"
                           << (std::is_unsigned_v<Integer> ? " >= 0" : "") << ", got '" << text << "'",
                  help_hint());
  return parsed;
}

template std::int64_t CommandLine::integer<std::int64_t>(const std::string&) const;
template std::uint64_t CommandLine::integer<std::uint64_t>(const std::string&) const;

double CommandLine::number(const std::string& option) const {
  const std::string& text = value(option);
  double parsed = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  HPCTRAIN_VERIFY(error == std::errc() && end == text.data() + text.size() && !text.empty(), InputError,
                  command_ << ": " << option << " expects a number, got '" << text << "'", help_hint());
  return parsed;
}

bool print_help_if_asked(const CommandLine& line, const char* usage, const MpiEnvironment& mpi) {
  if (line.help() && mpi.is_root()) std::fputs(usage, stdout);
  return line.help();
}

}  // namespace hpctrain
