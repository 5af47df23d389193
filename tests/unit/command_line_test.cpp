// Tests of the command-line parser every command uses (include/hpctrain/app/command_line.hpp): values in both
// spellings, flags, repeatable options in order, positionals, --help winning, and one clear InputError for each kind
// of mistake, with "did you mean" for a misspelt option.
#include "hpctrain/app/command_line.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"

namespace hpctrain {
namespace {

const std::vector<OptionSpec> options = {
    {"--samples", true}, {"--output", true}, {"--force", false}, {"--set", true, true}};

std::string error_of(const Arguments& args) {
  try {
    const CommandLine line(args, "hpctrain test", options);
  } catch (const InputError& error) {
    return std::string(error.what()) + " | " + error.hint();
  }
  return "no error";
}

TEST(CommandLine, ReadsValuesFlagsRepeatsAndPositionals) {
  const CommandLine line({"deck.toml", "--samples", "10", "--output=out.h5", "--set", "a.b=1", "--force",
                          "--set=c.d=2", "second"},
                         "hpctrain test", options);
  EXPECT_FALSE(line.help());
  EXPECT_EQ(line.positionals(), (std::vector<std::string>{"deck.toml", "second"}));
  EXPECT_EQ(line.integer<std::int64_t>("--samples"), 10);
  EXPECT_EQ(line.value("--output"), "out.h5");
  EXPECT_TRUE(line.has("--force"));
  EXPECT_EQ(line.values("--set"), (std::vector<std::string>{"a.b=1", "c.d=2"}));
  EXPECT_TRUE(line.values("--absent").empty());
  EXPECT_EQ(line.value_or("--absent", "fallback"), "fallback");
  EXPECT_EQ(line.help_hint(), "see 'hpctrain test --help'");
}

TEST(CommandLine, HelpWinsOverEverythingElse) {
  EXPECT_TRUE(CommandLine({"--bogus", "-h"}, "hpctrain test", options).help());
  EXPECT_TRUE(CommandLine({"--samples", "x", "--help"}, "hpctrain test", options).help());
}

TEST(CommandLine, EachMistakeIsOneClearInputError) {
  EXPECT_EQ(error_of({"--smaples", "3"}),
            "hpctrain test: unknown option '--smaples' | did you mean '--samples'? see 'hpctrain test --help'");
  EXPECT_EQ(error_of({"--zzzzzzzz"}), "hpctrain test: unknown option '--zzzzzzzz' | see 'hpctrain test --help'");
  EXPECT_EQ(error_of({"--output"}), "hpctrain test: --output needs a value | see 'hpctrain test --help'");
  EXPECT_EQ(error_of({"--force=yes"}), "hpctrain test: --force takes no value | see 'hpctrain test --help'");
  EXPECT_EQ(error_of({"--output", "a", "--output=b"}),
            "hpctrain test: --output given twice | see 'hpctrain test --help'");
}

TEST(CommandLine, NumbersAndRequiredValuesAreChecked) {
  const CommandLine line({"--samples", "ten"}, "hpctrain test", options);
  try {
    (void)line.integer<std::int64_t>("--samples");
    FAIL() << "no error";
  } catch (const InputError& error) {
    EXPECT_STREQ(error.what(), "hpctrain test: --samples expects a whole number, got 'ten'");
  }
  EXPECT_THROW((void)line.number("--samples"), InputError);
  EXPECT_THROW((void)line.value("--output"), InputError);
  const CommandLine negative({"--samples=-3"}, "hpctrain test", options);
  EXPECT_THROW((void)negative.integer<std::uint64_t>("--samples"), InputError);
  EXPECT_EQ(negative.integer<std::int64_t>("--samples"), -3);
}

}  // namespace
}  // namespace hpctrain
