// The deck's schema, private to src/config: the sections, their keys and value kinds, the layer keys per layer type,
// and where each value lives inside a RunConfig. One schema drives reading, unknown-key suggestions, to_toml and
// accepted_keys. Adding a field to run_config.hpp means adding one line here (deck_schema.cpp), one range check in
// deck_validation.cpp if it has a range, and a row in docs/input-reference.md (a test checks that).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "hpctrain/config/run_config.hpp"

namespace hpctrain::deck {

// How a key's TOML value is read. `number` accepts integers too; `loss_scale` is a word or a positive number;
// `string_array` is an array of strings (a single string is taken as a one-element array); `shuffle` is a boolean or a
// word (true = "global", false = "none").
// `extents` is an integer or an array of integers (conv/pool windows). `seconds_or_off` is a number, or false for 0
// (off). `number_array` is an array of numbers (a single number is taken as a one-element array).
enum class ValueKind {
  integer,
  number,
  boolean,
  string,
  string_array,
  shuffle,
  loss_scale,
  layers,
  extents,
  seconds_or_off,
  number_array
};

// An enumeration field seen through its words (config/choices.hpp): the reader sets it from a word, to_toml writes
// the word back. `get`/`set` convert between the enum and its index in `words`.
struct ChoiceRef {
  void* field;
  std::span<const std::string_view> words;
  int (*get)(const void* field);
  void (*set)(void* field, int index);
  [[nodiscard]] std::string_view word() const { return words[static_cast<std::size_t>(get(field))]; }
};

// A list of enumeration values (checkpoint.on_signal).
struct ChoiceListRef {
  void* field;
  std::span<const std::string_view> words;
  std::vector<int> (*get)(const void* field);
  void (*set)(void* field, const std::vector<int>& indices);
};

template <class Choice>
ChoiceRef choice_ref(Choice* field) {
  return {field, choice_words<Choice>(), [](const void* f) { return static_cast<int>(*static_cast<const Choice*>(f)); },
          [](void* f, int index) { *static_cast<Choice*>(f) = static_cast<Choice>(index); }};
}

template <class Choice>
ChoiceListRef choice_list_ref(std::vector<Choice>* field) {
  return {field, choice_words<Choice>(),
          [](const void* f) {
            std::vector<int> indices;
            for (const Choice value : *static_cast<const std::vector<Choice>*>(f))
              indices.push_back(static_cast<int>(value));
            return indices;
          },
          [](void* f, const std::vector<int>& indices) {
            auto& values = *static_cast<std::vector<Choice>*>(f);
            values.clear();
            for (const int index : indices) values.push_back(static_cast<Choice>(index));
          }};
}

// Where a key's value lives inside a RunConfig (or a LayerSpec). monostate for model.layers, which is read separately.
using FieldRef = std::variant<std::monostate, std::int64_t*, std::uint64_t*, double*, bool*, std::string*,
                              std::vector<std::string>*, std::vector<std::int64_t>*, std::vector<double>*, ChoiceRef,
                              ChoiceListRef, LossScaleSetting*, TimeLimit*>;

template <class T>
FieldRef field_ref(T* field) {
  if constexpr (std::is_enum_v<T>) {
    return choice_ref(field);
  } else if constexpr (requires { requires std::is_enum_v<typename T::value_type>; }) {
    return choice_list_ref(field);
  } else {
    return field;
  }
}

template <auto section_member, auto field_member>
FieldRef bind_field(RunConfig& config) {
  return field_ref(&((config.*section_member).*field_member));
}

template <auto field_member>
FieldRef bind_layer_field(LayerSpec& layer) {
  return field_ref(&(layer.*field_member));
}

inline FieldRef bind_nothing(RunConfig&) { return std::monostate{}; }
inline FieldRef bind_no_layer_field(LayerSpec&) { return std::monostate{}; }  // a residual's layers, read separately

struct FieldSpec {
  std::string_view key;  // within its section
  ValueKind kind;
  FieldRef (*bind)(RunConfig&);
};

struct SectionSpec {
  std::string_view name;
  std::vector<FieldSpec> fields;
};

// Sections and keys in the order to_toml writes them (and the documentation lists them).
const std::vector<SectionSpec>& schema();

// The largest finite fp32 value: loss scales are applied in fp32.
constexpr double largest_float = 3.4028234663852886e38;
constexpr std::int64_t max_count = 2147483647;  // 2^31 - 1: the largest count or size a deck integer may give

// The words precision.loss_scale accepts besides a positive number.
inline const std::vector<std::string_view> loss_scale_words = {"auto", "dynamic", "none"};

struct LayerFieldSpec {
  std::string_view key;
  ValueKind kind;
  FieldRef (*bind)(LayerSpec&);
};

const std::vector<LayerFieldSpec>& layer_fields();

// Which keys each layer type takes besides `type` and `name` (which every layer takes).
struct LayerTypeSpec {
  LayerType type;
  std::vector<std::string_view> keys;
};

const std::vector<LayerTypeSpec>& layer_types();

const SectionSpec* find_section(std::string_view name);

const FieldSpec* find_field(const SectionSpec& section, std::string_view key);

const LayerFieldSpec* find_layer_field(std::string_view key);

const LayerTypeSpec* find_layer_type(LayerType type);

bool layer_type_accepts(const LayerTypeSpec& spec, std::string_view key);

template <class Range>
std::string join(const Range& words, std::string_view separator = ", ") {
  std::string text;
  for (const auto& word : words) {
    if (!text.empty()) text += separator;
    text += word;
  }
  return text;
}

std::vector<std::string_view> section_keys(const SectionSpec& section);

std::vector<std::string_view> all_layer_keys();

}  // namespace hpctrain::deck
