// "Did you mean": the closest valid name to a misspelt one, for the deck reader (keys, sections, layer types, words)
// and the command-line parsers (options). Case-insensitive edit distance counting swaps of neighbours, plus two rules
// for how people misspell configuration names: initials ("learning_rate" finds "lr") and one word more or less
// ("batch" finds "batch_size"). Names too far from every candidate get no suggestion.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hpctrain {

// A candidate: the name shown to the user, the name compared against, and a cost added to its distance (to prefer
// some candidates over equally close others).
struct Suggestion {
  std::string shown;
  std::string compared;
  double extra_cost = 0.0;
};

// The closest candidate's shown name; the first of equally close ones wins; nullopt when none is close enough.
std::optional<std::string> closest_name(std::string_view typed, const std::vector<Suggestion>& candidates);

// "; did you mean 'NAME'?" for a suggestion, "" for none.
std::string did_you_mean(const std::optional<std::string>& suggestion);

std::string lowercase(std::string_view text);

}  // namespace hpctrain
