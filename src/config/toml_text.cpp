// TOML text helpers.
#include "toml_text.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <system_error>

namespace hpctrain::deck {
std::string toml_float(double value) {
  std::string text = shortest_number_text(value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // 'n' covers inf and nan
  return text;
}

std::string toml_string(std::string_view text) {
  std::string quoted = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        quoted += "\\\"";
        break;
      case '\\':
        quoted += "\\\\";
        break;
      case '\n':
        quoted += "\\n";
        break;
      case '\t':
        quoted += "\\t";
        break;
      case '\r':
        quoted += "\\r";
        break;
      default:
        if (byte < 0x20 || byte == 0x7f) {
          char escape[8];
          std::snprintf(escape, sizeof escape, "\\u%04X", static_cast<unsigned>(byte));
          quoted += escape;
        } else {
          quoted += c;
        }
    }
  }
  return quoted + "\"";
}

std::string toml_literal(const FieldRef& target) {
  struct Writer {
    std::string operator()(std::monostate) const { return {}; }
    std::string operator()(const std::int64_t* value) const { return std::to_string(*value); }
    std::string operator()(const std::uint64_t* value) const { return std::to_string(*value); }
    std::string operator()(const double* value) const { return toml_float(*value); }
    std::string operator()(const bool* value) const { return *value ? "true" : "false"; }
    std::string operator()(const std::string* value) const { return toml_string(*value); }
    std::string operator()(const std::vector<std::string>* values) const {
      std::string text = "[";
      for (std::size_t i = 0; i < values->size(); ++i) text += (i > 0 ? ", " : "") + toml_string((*values)[i]);
      return text + "]";
    }
    std::string operator()(const std::vector<std::int64_t>* values) const {
      if (values->size() == 1) return std::to_string(values->front());
      std::string text = "[";
      for (std::size_t i = 0; i < values->size(); ++i) text += (i > 0 ? ", " : "") + std::to_string((*values)[i]);
      return text + "]";
    }
    std::string operator()(const std::vector<double>* values) const {
      std::string text = "[";
      for (std::size_t i = 0; i < values->size(); ++i) text += (i > 0 ? ", " : "") + toml_float((*values)[i]);
      return text + "]";
    }
    std::string operator()(const ChoiceRef& choice) const { return toml_string(choice.word()); }
    std::string operator()(const ChoiceListRef& choices) const {
      std::string text = "[";
      const std::vector<int> indices = choices.get(choices.field);
      for (std::size_t i = 0; i < indices.size(); ++i)
        text += (i > 0 ? ", " : "") + toml_string(choices.words[static_cast<std::size_t>(indices[i])]);
      return text + "]";
    }
    std::string operator()(const LossScaleSetting* setting) const {
      return toml_string(std::visit(
          [](const auto& value) -> std::string {
            using Setting = std::decay_t<decltype(value)>;
            if constexpr (std::is_same_v<Setting, AutoLossScale>) return "auto";
            if constexpr (std::is_same_v<Setting, DynamicLossScale>) return "dynamic";
            if constexpr (std::is_same_v<Setting, NoLossScale>) return "none";
            if constexpr (std::is_same_v<Setting, FixedLossScale>) return shortest_number_text(value.value);
          },
          *setting));
    }
    std::string operator()(const TimeLimit* limit) const { return toml_string(limit->text); }
  };
  return std::visit(Writer{}, target);
}

std::string toml_literal(ValueKind kind, const FieldRef& target) {
  if (kind == ValueKind::shuffle) {
    const std::string_view word = std::get<ChoiceRef>(target).word();
    if (word == "global") return "true";
    if (word == "none") return "false";
  }
  return toml_literal(target);
}

std::string describe(const toml::node& node) {
  constexpr std::size_t max_shown = 40;
  auto shorten = [&](std::string text) {
    if (text.size() > max_shown) text = text.substr(0, max_shown) + "...";
    return text;
  };
  if (const auto* value = node.as_string()) return "a string (" + shorten(toml_string(value->get())) + ")";
  if (const auto* value = node.as_integer()) return "an integer (" + std::to_string(value->get()) + ")";
  if (const auto* value = node.as_floating_point()) return "a float (" + toml_float(value->get()) + ")";
  if (const auto* value = node.as_boolean())
    return std::string("a boolean (") + (value->get() ? "true" : "false") + ")";
  if (node.is_table()) return "a table";
  if (node.is_array()) return "an array";
  if (node.is_date()) return "a date";
  if (node.is_time()) return "a time";
  if (node.is_date_time()) return "a date-time";
  return "an unknown kind of value";
}

std::string_view expected_description(ValueKind kind) {
  switch (kind) {
    case ValueKind::integer:
      return "an integer";
    case ValueKind::number:
      return "a number";
    case ValueKind::boolean:
      return "a boolean (true or false)";
    case ValueKind::string:
      return "a string";
    case ValueKind::string_array:
      return "an array of strings";
    case ValueKind::shuffle:
      return "a boolean or a string (true, false or \"local\")";
    case ValueKind::loss_scale:
      return "a string (auto, dynamic, none) or a positive number";
    case ValueKind::layers:
      return "an array of tables";
    case ValueKind::extents:
      return "an integer or an array of integers";
    case ValueKind::seconds_or_off:
      return "a number of seconds, or false (off)";
    case ValueKind::number_array:
      return "an array of numbers";
  }
  return "a value";
}

std::string example_literal(std::string_view dotted_key, const std::string& default_literal) {
  if (dotted_key == "data.train") return "\"data/train.h5\"";
  if (dotted_key == "data.validation") return "\"data/validation.h5\"";
  if (dotted_key == "train.time_limit") return "\"11:50:00\"";
  if (dotted_key == "run.output") return "\"runs/my_run\"";
  if (dotted_key == "model.layers[].type") return "\"linear\"";
  if (dotted_key == "model.layers[].name") return "\"encoder\"";
  if (dotted_key == "model.layers[].out") return "64";
  if (dotted_key == "model.layers[].kernel") return "3";
  if (dotted_key == "model.layers[].stride") return "1";
  if (dotted_key == "model.layers[].layers") return "[{type = \"linear\", out = 64}, {type = \"relu\"}]";
  return default_literal;
}

std::optional<double> parse_number_text(std::string_view text) {
  double value = 0.0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec != std::errc() || result.ptr != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<std::int64_t> time_limit_seconds(std::string_view text) {
  std::vector<std::int64_t> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t colon = std::min(text.find(':', start), text.size());
    const std::string_view digits = text.substr(start, colon - start);
    std::int64_t value = 0;
    const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || digits.size() > 9 || result.ptr != digits.data() + digits.size() || result.ec != std::errc())
      return std::nullopt;
    if (!fields.empty() && (digits.size() != 2 || value >= 60)) return std::nullopt;
    fields.push_back(value);
    if (colon == text.size()) break;
    start = colon + 1;
  }
  if (fields.size() < 2 || fields.size() > 3) return std::nullopt;
  std::int64_t seconds = 0;
  for (const std::int64_t field : fields) seconds = seconds * 60 + field;
  if (seconds <= 0) return std::nullopt;
  return seconds;
}

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return std::string(text.substr(first, last - first + 1));
}

SourcePosition position_of(const toml::source_region& region) {
  return SourcePosition{static_cast<int>(region.begin.line), static_cast<int>(region.begin.column)};
}

std::vector<std::pair<const toml::key*, const toml::node*>> in_document_order(const toml::table& table) {
  std::vector<std::pair<const toml::key*, const toml::node*>> entries;
  for (const auto& [key, node] : table) entries.emplace_back(&key, &node);
  auto order = [](const toml::key* key) {
    const auto& begin = key->source().begin;
    return std::pair<long, long>(begin.line == 0 ? LONG_MAX : static_cast<long>(begin.line),
                                 static_cast<long>(begin.column));
  };
  std::stable_sort(entries.begin(), entries.end(),
                   [&](const auto& left, const auto& right) { return order(left.first) < order(right.first); });
  return entries;
}

std::string layer_key(std::size_t index, std::string_view key) {
  return dotted_layer_key(layer_table_key("model.layers", index), key);
}

std::string layer_table_key(const std::string& list_key, std::size_t index) {
  std::string table_key = list_key;  // (appended: GCC 12's -Wrestrict misfires on chains of + here)
  table_key.append("[").append(std::to_string(index)).append("]");
  return table_key;
}

std::string dotted_layer_key(const std::string& table_key, std::string_view key) {
  std::string dotted = table_key;
  if (!key.empty()) dotted.append(".").append(key);
  return dotted;
}

}  // namespace hpctrain::deck
