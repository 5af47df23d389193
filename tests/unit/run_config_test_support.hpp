// Shared by the deck parser's tests (run_config_test.cpp, run_config_errors_test.cpp): a minimal deck, decks with one
// key set, and the InputError a deck produces.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::deck_test {

// parse_run_config never opens the deck, so the path only shows up in messages and in path resolution.
inline const std::string deck_path = "decks/test.toml";

// The smallest valid deck; tests add their keys above it so that those land on known lines.
inline const std::string minimal_body =
    "[data]\n"
    "train = \"train.h5\"\n"
    "\n"
    "[train]\n"
    "steps = 100\n"
    "\n"
    "[[model.layers]]\n"
    "type = \"linear\"\n"
    "out = 10\n";

inline RunConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_run_config(text, deck_path, overrides);
}

struct CaughtError {
  std::string message;
  std::string hint;
};

// The InputError a deck produces (a test failure when it parses).
inline CaughtError error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const InputError& error) {
    EXPECT_EQ(error.scope(), ErrorScope::all_ranks);
    EXPECT_EQ(error.exit_code(), exit_input_error);
    EXPECT_FALSE(error.hint().empty()) << error.what();
    return {error.what(), error.hint()};
  }
  ADD_FAILURE() << "expected an InputError for the deck:\n" << text;
  return {};
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

#define EXPECT_CONTAINS(text, part) EXPECT_PRED2(contains, text, part)

// A valid deck with `dotted_key = value_text` on line 2, column 1 (its section header on line 1); the key replaces
// the minimal deck's value when that deck has one.
inline std::string deck_with(const std::string& dotted_key, const std::string& value_text) {
  const auto dot = dotted_key.find('.');
  const std::string section = dotted_key.substr(0, dot), key = dotted_key.substr(dot + 1);
  std::vector<std::pair<std::string, std::vector<std::string>>> sections = {
      {"data", {"train = \"train.h5\""}},
      {"train", {"steps = 100"}},
  };
  std::string text = "[" + section + "]\n" + key + " = " + value_text + "\n";
  for (const auto& [name, lines] : sections)
    if (name == section)
      for (const auto& line : lines)
        if (line.rfind(key + " ", 0) != 0) text += line + "\n";
  for (const auto& [name, lines] : sections) {
    if (name == section) continue;
    text += "\n[" + name + "]\n";
    for (const auto& line : lines) text += line + "\n";
  }
  return text + "\n[[model.layers]]\ntype = \"linear\"\nout = 10\n";
}

}  // namespace hpctrain::deck_test
