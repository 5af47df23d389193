// "Did you mean": the closest valid name to a misspelt one (see suggestions.hpp).
#include "hpctrain/core/suggestions.hpp"

#include <algorithm>
#include <cctype>

namespace hpctrain {
namespace {

// Edit distance counting insertions, deletions, substitutions and swaps of neighbours ("lamdba" -> "lambda" is 1).
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// "learning_rate" -> "lr": lets the common long spellings find our short keys (and "wd" find "weight_decay").
std::string initials(std::string_view text) {
  if (text.find('_') == std::string_view::npos) return {};
  std::string letters;
  bool at_word_start = true;
  for (char c : text) {
    if (c == '_') {
      at_word_start = true;
    } else if (at_word_start) {
      letters += c;
      at_word_start = false;
    }
  }
  return letters;
}

// How far a typed name is from a valid one (lower is closer); nullopt when too far to be worth suggesting.
std::optional<double> match_cost(std::string_view typed_text, std::string_view valid_text) {
  const std::string typed = lowercase(typed_text), valid = lowercase(valid_text);
  if (typed == valid) return 0.0;
  if (initials(typed) == valid || initials(valid) == typed) return 0.5;
  double cost = static_cast<double>(edit_distance(typed, valid));
  // "batch" for "batch_size", "grad_clip_norm" for "grad_clip": one word more or less.
  if (!typed.empty() && (valid.find(typed) != std::string::npos || typed.find(valid) != std::string::npos))
    cost = std::min(cost, 1.5);
  const double tolerance = std::max(2.0, static_cast<double>(typed.size()) / 3.0);
  if (cost > tolerance) return std::nullopt;
  return cost;
}

}  // namespace

std::string lowercase(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

std::optional<std::string> closest_name(std::string_view typed, const std::vector<Suggestion>& candidates) {
  std::optional<std::string> best;
  double best_cost = 1e9;
  for (const auto& candidate : candidates) {
    const auto cost = match_cost(typed, candidate.compared);
    if (cost && *cost + candidate.extra_cost < best_cost) {
      best_cost = *cost + candidate.extra_cost;
      best = candidate.shown;
    }
  }
  return best;
}

std::string did_you_mean(const std::optional<std::string>& suggestion) {
  return suggestion ? "; did you mean '" + *suggestion + "'?" : std::string{};
}

}  // namespace hpctrain
