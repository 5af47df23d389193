// The input-deck parser: TOML text plus --set overrides in, a validated RunConfig out (and back to TOML again).
//
// One schema (sections, their keys and value kinds, the layer keys per layer type) drives everything here: reading,
// unknown-key suggestions, to_toml and accepted_keys. Adding a field to run_config.hpp means adding one line to the
// schema, one range check in validate() if it has a range, and a row in docs/input-reference.md (a test checks that).
//
// Every error is an InputError whose message starts with where the value came from ("deck.toml:12:5" or
// "--set optimizer.lr=-1"), names the key, and says what would be valid; the hint says what to write instead.
#include "hpctrain/config/run_config.hpp"

#include <glob.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/core/suggestions.hpp"

namespace hpctrain {
namespace {

// ---------------------------------------------------------------------------------------------------------------------
// Schema
// ---------------------------------------------------------------------------------------------------------------------

// How a key's TOML value is read. `number` accepts integers too; `loss_scale` is a word or a positive number;
// `string_array` is an array of strings (a single string is taken as a one-element array); `shuffle` is a boolean or a
// word (true = "global", false = "none").
// `extents` is an integer or an array of integers (conv/pool windows).
enum class ValueKind { integer, number, boolean, string, string_array, shuffle, loss_scale, layers, extents };

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
using FieldRef =
    std::variant<std::monostate, std::int64_t*, std::uint64_t*, double*, bool*, std::string*, std::vector<std::string>*,
                 std::vector<std::int64_t>*, ChoiceRef, ChoiceListRef, LossScaleSetting*, TimeLimit*>;

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

FieldRef bind_nothing(RunConfig&) { return std::monostate{}; }

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
const std::vector<SectionSpec>& schema() {
  using Kind = ValueKind;
  using Config = RunConfig;
  static const std::vector<SectionSpec> sections = {
      {"run",
       {
           {"seed", Kind::integer, bind_field<&Config::run, &RunSection::seed>},
           {"output", Kind::string, bind_field<&Config::run, &RunSection::output>},
           {"device", Kind::string, bind_field<&Config::run, &RunSection::device>},
           {"threads", Kind::integer, bind_field<&Config::run, &RunSection::threads>},
           {"cuda_graphs", Kind::boolean, bind_field<&Config::run, &RunSection::cuda_graphs>},
       }},
      {"model",
       {
           {"layers", Kind::layers, bind_nothing},
           {"loss", Kind::string, bind_field<&Config::model, &ModelSection::loss>},
       }},
      {"data",
       {
           {"train", Kind::string_array, bind_field<&Config::data, &DataSection::train>},
           {"validation", Kind::string_array, bind_field<&Config::data, &DataSection::validation>},
           {"features", Kind::string, bind_field<&Config::data, &DataSection::features>},
           {"labels", Kind::string, bind_field<&Config::data, &DataSection::labels>},
           {"targets", Kind::string, bind_field<&Config::data, &DataSection::targets>},
           {"batch_size", Kind::integer, bind_field<&Config::data, &DataSection::batch_size>},
           {"eval_batch_size", Kind::integer, bind_field<&Config::data, &DataSection::eval_batch_size>},
           {"shuffle", Kind::shuffle, bind_field<&Config::data, &DataSection::shuffle>},
           {"drop_last", Kind::boolean, bind_field<&Config::data, &DataSection::drop_last>},
           {"prefetch", Kind::integer, bind_field<&Config::data, &DataSection::prefetch>},
           {"in_memory", Kind::boolean, bind_field<&Config::data, &DataSection::in_memory>},
           {"log1p", Kind::boolean, bind_field<&Config::data, &DataSection::log1p>},
           {"scale", Kind::number, bind_field<&Config::data, &DataSection::scale>},
           {"shift", Kind::number, bind_field<&Config::data, &DataSection::shift>},
       }},
      {"train",
       {
           {"steps", Kind::integer, bind_field<&Config::train, &TrainSection::steps>},
           {"epochs", Kind::integer, bind_field<&Config::train, &TrainSection::epochs>},
           {"log_every", Kind::integer, bind_field<&Config::train, &TrainSection::log_every>},
           {"eval_every", Kind::integer, bind_field<&Config::train, &TrainSection::eval_every>},
           {"profile", Kind::boolean, bind_field<&Config::train, &TrainSection::profile>},
           {"time_limit", Kind::string, bind_field<&Config::train, &TrainSection::time_limit>},
           {"accumulate", Kind::integer, bind_field<&Config::train, &TrainSection::accumulate>},
       }},
      {"optimizer",
       {
           {"type", Kind::string, bind_field<&Config::optimizer, &OptimizerSection::type>},
           {"lr", Kind::number, bind_field<&Config::optimizer, &OptimizerSection::lr>},
           {"weight_decay", Kind::number, bind_field<&Config::optimizer, &OptimizerSection::weight_decay>},
           {"beta1", Kind::number, bind_field<&Config::optimizer, &OptimizerSection::beta1>},
           {"beta2", Kind::number, bind_field<&Config::optimizer, &OptimizerSection::beta2>},
           {"eps", Kind::number, bind_field<&Config::optimizer, &OptimizerSection::eps>},
           {"momentum", Kind::number, bind_field<&Config::optimizer, &OptimizerSection::momentum>},
           {"nesterov", Kind::boolean, bind_field<&Config::optimizer, &OptimizerSection::nesterov>},
           {"grad_clip", Kind::number, bind_field<&Config::optimizer, &OptimizerSection::grad_clip>},
           {"no_decay", Kind::string_array, bind_field<&Config::optimizer, &OptimizerSection::no_decay>},
       }},
      {"schedule",
       {
           {"type", Kind::string, bind_field<&Config::schedule, &ScheduleSection::type>},
           {"warmup_steps", Kind::integer, bind_field<&Config::schedule, &ScheduleSection::warmup_steps>},
           {"min_lr", Kind::number, bind_field<&Config::schedule, &ScheduleSection::min_lr>},
           {"step_size", Kind::integer, bind_field<&Config::schedule, &ScheduleSection::step_size>},
           {"gamma", Kind::number, bind_field<&Config::schedule, &ScheduleSection::gamma>},
       }},
      {"precision",
       {
           {"mode", Kind::string, bind_field<&Config::precision, &PrecisionSection::mode>},
           {"loss_scale", Kind::loss_scale, bind_field<&Config::precision, &PrecisionSection::loss_scale>},
           {"init_scale", Kind::number, bind_field<&Config::precision, &PrecisionSection::init_scale>},
           {"growth_factor", Kind::number, bind_field<&Config::precision, &PrecisionSection::growth_factor>},
           {"backoff_factor", Kind::number, bind_field<&Config::precision, &PrecisionSection::backoff_factor>},
           {"growth_interval", Kind::integer, bind_field<&Config::precision, &PrecisionSection::growth_interval>},
           {"max_skipped_steps", Kind::integer, bind_field<&Config::precision, &PrecisionSection::max_skipped_steps>},
       }},
      {"checkpoint",
       {
           {"every_steps", Kind::integer, bind_field<&Config::checkpoint, &CheckpointSection::every_steps>},
           {"every_seconds", Kind::number, bind_field<&Config::checkpoint, &CheckpointSection::every_seconds>},
           {"keep", Kind::integer, bind_field<&Config::checkpoint, &CheckpointSection::keep>},
           {"at_end", Kind::boolean, bind_field<&Config::checkpoint, &CheckpointSection::at_end>},
           {"on_signal", Kind::string_array, bind_field<&Config::checkpoint, &CheckpointSection::on_signal>},
       }},
  };
  return sections;
}

// The largest finite fp32 value: loss scales are applied in fp32.
constexpr double largest_float = 3.4028234663852886e38;
constexpr std::int64_t max_count = 2147483647;  // 2^31 - 1: the largest count or size a deck integer may give

// The words precision.loss_scale accepts besides a positive number.
const std::vector<std::string_view> loss_scale_words = {"auto", "dynamic", "none"};

struct LayerFieldSpec {
  std::string_view key;
  ValueKind kind;
  FieldRef (*bind)(LayerSpec&);
};

const std::vector<LayerFieldSpec>& layer_fields() {
  using Kind = ValueKind;
  static const std::vector<LayerFieldSpec> fields = {
      {"type", Kind::string, bind_layer_field<&LayerSpec::type>},
      {"name", Kind::string, bind_layer_field<&LayerSpec::name>},
      {"out", Kind::integer, bind_layer_field<&LayerSpec::out>},
      {"in", Kind::integer, bind_layer_field<&LayerSpec::in>},
      {"bias", Kind::boolean, bind_layer_field<&LayerSpec::bias>},
      {"p", Kind::number, bind_layer_field<&LayerSpec::p>},
      {"negative_slope", Kind::number, bind_layer_field<&LayerSpec::negative_slope>},
      {"eps", Kind::number, bind_layer_field<&LayerSpec::eps>},
      {"kernel", Kind::extents, bind_layer_field<&LayerSpec::kernel>},
      {"stride", Kind::extents, bind_layer_field<&LayerSpec::stride>},
      {"padding", Kind::extents, bind_layer_field<&LayerSpec::padding>},
      {"dilation", Kind::extents, bind_layer_field<&LayerSpec::dilation>},
      {"groups", Kind::integer, bind_layer_field<&LayerSpec::groups>},
  };
  return fields;
}

// Which keys each layer type takes besides `type` and `name` (which every layer takes).
struct LayerTypeSpec {
  LayerType type;
  std::vector<std::string_view> keys;
};

const std::vector<LayerTypeSpec>& layer_types() {
  using enum LayerType;
  static const std::vector<LayerTypeSpec> types = {
      {linear, {"out", "in", "bias"}},
      {relu, {}},
      {gelu, {}},
      {tanh, {}},
      {leaky_relu, {"negative_slope"}},
      {layernorm, {"eps"}},
      {dropout, {"p"}},
      {conv2d, {"out", "kernel", "stride", "padding", "dilation", "groups", "bias"}},
      {conv3d, {"out", "kernel", "stride", "padding", "dilation", "groups", "bias"}},
      {maxpool2d, {"kernel", "stride", "padding"}},
      {maxpool3d, {"kernel", "stride", "padding"}},
      {avgpool2d, {"kernel", "stride", "padding"}},
      {avgpool3d, {"kernel", "stride", "padding"}},
      {global_avgpool, {}},
      {flatten, {}},
      {groupnorm, {"groups", "eps"}},
  };
  return types;
}

const SectionSpec* find_section(std::string_view name) {
  for (const auto& section : schema())
    if (section.name == name) return &section;
  return nullptr;
}

const FieldSpec* find_field(const SectionSpec& section, std::string_view key) {
  for (const auto& field : section.fields)
    if (field.key == key) return &field;
  return nullptr;
}

const LayerFieldSpec* find_layer_field(std::string_view key) {
  for (const auto& field : layer_fields())
    if (field.key == key) return &field;
  return nullptr;
}

const LayerTypeSpec* find_layer_type(LayerType type) {
  for (const auto& spec : layer_types())
    if (spec.type == type) return &spec;
  return nullptr;
}

bool layer_type_accepts(const LayerTypeSpec& spec, std::string_view key) {
  return key == "type" || key == "name" || std::find(spec.keys.begin(), spec.keys.end(), key) != spec.keys.end();
}

template <class Range>
std::string join(const Range& words, std::string_view separator = ", ") {
  std::string text;
  for (const auto& word : words) {
    if (!text.empty()) text += separator;
    text += word;
  }
  return text;
}

std::vector<std::string_view> section_keys(const SectionSpec& section) {
  std::vector<std::string_view> keys;
  for (const auto& field : section.fields) keys.push_back(field.key);
  return keys;
}

std::vector<std::string_view> all_layer_keys() {
  std::vector<std::string_view> keys;
  for (const auto& field : layer_fields()) keys.push_back(field.key);
  return keys;
}

// ---------------------------------------------------------------------------------------------------------------------
// Formatting values (for messages and for to_toml)
// ---------------------------------------------------------------------------------------------------------------------

// Shortest text that reads back as the same double ("0.1", "1e-08", "65536").
std::string shortest_number_text(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// A TOML float literal: like shortest_number_text but always recognisably a float ("3.0", not "3").
std::string toml_float(double value) {
  std::string text = shortest_number_text(value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // 'n' covers inf and nan
  return text;
}

// A TOML basic string literal with the characters TOML requires escaped.
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

// The TOML literal for a field's current value (loss_scale is always written as a string: "auto", "1024", ...).
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

// The TOML literal of a field as to_toml writes it: data.shuffle's words global/none are written as true/false.
std::string toml_literal(ValueKind kind, const FieldRef& target) {
  if (kind == ValueKind::shuffle) {
    const std::string_view word = std::get<ChoiceRef>(target).word();
    if (word == "global") return "true";
    if (word == "none") return "false";
  }
  return toml_literal(target);
}

// A short description of what a TOML value is, for "expected X, got Y" messages.
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
  }
  return "a value";
}

// Example values for keys whose default is empty, so that type-error hints always show something writable.
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
  return default_literal;
}

// The number a loss_scale text means, when it is one (whole text, finite).
std::optional<double> parse_number_text(std::string_view text) {
  double value = 0.0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec != std::errc() || result.ptr != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// train.time_limit in seconds: "H:MM:SS" (any number of hour digits) or "M:SS" (any number of minute digits), with
// two-digit minutes and seconds below 60 after a colon; nullopt for anything else, or for a total of zero.
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

// A table's entries in the order they were written (toml++ keeps keys sorted); keys without a source position
// (inserted by --set) come last.
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
  return "model.layers[" + std::to_string(index) + "]" + (key.empty() ? std::string{} : "." + std::string(key));
}

// ---------------------------------------------------------------------------------------------------------------------
// The reader
// ---------------------------------------------------------------------------------------------------------------------

class DeckReader {
 public:
  explicit DeckReader(std::string deck_path) : deck_path_(std::move(deck_path)) { config_.deck_path = deck_path_; }

  RunConfig read(std::string_view deck_text, const std::vector<std::string>& overrides) {
    toml::table root = parse_deck(deck_text);
    for (const auto& override_text : overrides) apply_override(root, override_text);
    read_root(root);
    validate();
    fill_defaults_and_resolve_paths();
    return std::move(config_);
  }

 private:
  std::string deck_path_;
  RunConfig config_;
  std::map<std::string, std::string> set_by_override_;      // dotted key -> the --set argument that gave its value
  std::vector<std::vector<std::string>> layer_keys_given_;  // per layer, the keys the deck or --set wrote

  // ---- errors ----

  [[noreturn]] void fail(const std::string& where, const std::string& problem, const std::string& hint) const {
    throw InputError(where + ": " + problem, hint);
  }

  std::string location(const SourcePosition& position) const {
    if (position.line <= 0) return deck_path_;
    return deck_path_ + ":" + std::to_string(position.line) + ":" + std::to_string(position.column);
  }

  const std::string* override_for(const std::string& dotted_key) const {
    if (auto it = set_by_override_.find(dotted_key); it != set_by_override_.end()) return &it->second;
    // Everything inside a model.layers array given by --set came from that --set.
    if (dotted_key.rfind("model.layers[", 0) == 0)
      if (auto it = set_by_override_.find("model.layers"); it != set_by_override_.end()) return &it->second;
    return nullptr;
  }

  // "deck.toml:12:5", "--set optimizer.lr=-1", or just the deck path for a default.
  std::string location(const std::string& dotted_key) const {
    if (const auto* override_text = override_for(dotted_key)) return "--set " + *override_text;
    const auto it = config_.positions.find(dotted_key);
    return location(it == config_.positions.end() ? SourcePosition{} : it->second);
  }

  // The default of a key as TOML text ("0.001", "\"cpu\""), for hints.
  static std::string default_literal(std::string_view section_name, const FieldSpec& field) {
    RunConfig defaults;
    return example_literal(std::string(section_name) + "." + std::string(field.key),
                           toml_literal(field.kind, field.bind(defaults)));
  }

  static std::string default_literal(const LayerFieldSpec& field) {
    LayerSpec defaults;
    return example_literal("model.layers[]." + std::string(field.key), toml_literal(field.bind(defaults)));
  }

  [[noreturn]] void type_error(const std::string& dotted_key, ValueKind kind, const toml::node& node,
                               const std::string& example) const {
    fail(location(dotted_key),
         dotted_key + " must be " + std::string(expected_description(kind)) + ", got " + describe(node),
         "write it like " + example +
             (kind == ValueKind::string || kind == ValueKind::string_array ? " (strings need quotes)"
              : kind == ValueKind::shuffle                                 ? ""
                                                                           : " (no quotes)"));
  }

  [[noreturn]] void range_error(const std::string& dotted_key, const std::string& rule, const std::string& got,
                                const std::string& hint) const {
    fail(location(dotted_key), dotted_key + " must be " + rule + " (got " + got + ")", hint);
  }

  [[noreturn]] void unknown_key(const std::string& where, const SectionSpec& section, std::string_view key) const {
    std::vector<Suggestion> candidates;
    for (const auto& field : section.fields)
      candidates.push_back({std::string(section.name) + "." + std::string(field.key), std::string(field.key)});
    // The same key in another section ([train] lr = ... means optimizer.lr) is a likely slip too.
    for (const auto& other : schema())
      if (other.name != section.name && find_field(other, key))
        candidates.push_back({std::string(other.name) + "." + std::string(key), std::string(key), 1.0});
    const std::string dotted = std::string(section.name) + "." + std::string(key);
    fail(where, "unknown key '" + dotted + "'" + did_you_mean(closest_name(key, candidates)),
         "valid keys in [" + std::string(section.name) + "]: " + join(section_keys(section)) +
             " (docs/input-reference.md describes each)");
  }

  // is_table: written as [name] (or name.key = ...); is_array_of_tables: as [[name]]; neither: a plain key.
  [[noreturn]] void unknown_section(const std::string& where, std::string_view name, bool is_table,
                                    bool is_array_of_tables = false) const {
    std::vector<Suggestion> candidates;
    std::vector<std::string> section_names;
    for (const auto& section : schema()) {
      candidates.push_back({"[" + std::string(section.name) + "]", std::string(section.name)});
      section_names.push_back("[" + std::string(section.name) + "]");
    }
    if (!is_table && !is_array_of_tables) {
      // A key written before any [section] header: suggest the section that has it.
      std::vector<Suggestion> keys;
      for (const auto& section : schema())
        for (const auto& field : section.fields)
          keys.push_back({std::string(section.name) + "." + std::string(field.key), std::string(field.key)});
      const auto suggestion = closest_name(name, keys);
      fail(where, "key '" + std::string(name) + "' is not inside any section" + did_you_mean(suggestion),
           suggestion ? "move it below the [" + suggestion->substr(0, suggestion->find('.')) + "] header"
                      : "every key belongs to a section: " + join(section_names));
    }
    candidates.push_back({"[[model.layers]]", "layers"});
    const std::string shown = is_array_of_tables ? "[[" + std::string(name) + "]]" : "[" + std::string(name) + "]";
    fail(where, "unknown section '" + shown + "'" + did_you_mean(closest_name(name, candidates)),
         "valid sections: " + join(section_names) + " and [[model.layers]] for each layer");
  }

  [[noreturn]] void unknown_layer_key(const std::string& where, std::size_t index, std::string_view key) const {
    std::vector<Suggestion> candidates;
    for (const auto& field : layer_fields())
      candidates.push_back({layer_key(index, field.key), std::string(field.key)});
    fail(where, "unknown key '" + layer_key(index, key) + "'" + did_you_mean(closest_name(key, candidates)),
         "valid layer keys: " + join(all_layer_keys()) + " (which ones a layer takes depends on its type)");
  }

  // ---- TOML text ----

  toml::table parse_deck(std::string_view deck_text) const {
    try {
      return toml::parse(deck_text, std::string_view(deck_path_));
    } catch (const toml::parse_error& error) {
      fail(location(position_of(error.source())), "TOML syntax error: " + std::string(error.description()),
           "fix the TOML at that line and column (strings need quotes, e.g. device = \"cpu\"; see "
           "docs/input-reference.md)");
    }
  }

  // ---- --set overrides: applied to the parsed TOML tree, so they pass through exactly the same checks ----

  void apply_override(toml::table& root, const std::string& override_text) {
    const std::string where = "--set " + override_text;
    const auto equals = override_text.find('=');
    if (equals == std::string::npos)
      fail(where, "expected section.key=value", "for example --set optimizer.lr=0.01 or --set precision.mode=bf16");
    const std::string key = trim(std::string_view(override_text).substr(0, equals));
    const std::string raw_value = trim(std::string_view(override_text).substr(equals + 1));

    if (key.rfind("model.layers[", 0) == 0) {
      apply_layer_override(root, where, key, raw_value, override_text);
      return;
    }
    const auto dot = key.find('.');
    if (dot == std::string::npos)
      fail(where, "'" + key + "' is not a section.key name",
           "name the key with its section, for example --set optimizer.lr=0.01");
    const std::string section_name = key.substr(0, dot), field_key = key.substr(dot + 1);
    const SectionSpec* section = find_section(section_name);
    if (!section) unknown_section(where, section_name, true);
    const FieldSpec* field = find_field(*section, field_key);
    if (!field) unknown_key(where, *section, field_key);

    toml::node* section_node = root.get(section_name);
    if (!section_node) {
      root.insert(section_name, toml::table{});
      section_node = root.get(section_name);
    }
    auto* section_table = section_node->as_table();
    if (!section_table)
      fail(location(position_of(section_node->source())),
           "'" + section_name + "' must be a section, got " + describe(*section_node),
           "write it as a [" + section_name + "] table");
    insert_override_value(*section_table, field_key, field->kind, raw_value);
    if (field->kind == ValueKind::layers) {
      // A new layer list replaces any earlier per-layer overrides.
      std::erase_if(set_by_override_, [](const auto& entry) { return entry.first.rfind("model.layers[", 0) == 0; });
    }
    set_by_override_[key] = override_text;
  }

  void apply_layer_override(toml::table& root, const std::string& where, const std::string& key,
                            const std::string& raw_value, const std::string& override_text) {
    // model.layers[INDEX].KEY
    const std::string_view rest = std::string_view(key).substr(std::string_view("model.layers[").size());
    const auto close = rest.find(']');
    std::size_t index = 0;
    const auto digits = rest.substr(0, close == std::string_view::npos ? 0 : close);
    const auto parsed = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (close == std::string_view::npos || digits.empty() || parsed.ptr != digits.data() + digits.size() ||
        rest.substr(close + 1, 1) != ".")
      fail(where, "'" + key + "' is not a layer key",
           "write it like --set model.layers[2].out=128 (layers count from 0)");
    const std::string field_key(rest.substr(close + 2));
    const LayerFieldSpec* field = find_layer_field(field_key);
    if (!field) unknown_layer_key(where, index, field_key);

    auto* layers = root.at_path("model.layers").as_array();
    const std::size_t count = layers ? layers->size() : 0;
    if (index >= count)
      fail(where,
           "there is no model.layers[" + std::to_string(index) + "]: the deck defines " + std::to_string(count) +
               " layer" + (count == 1 ? "" : "s"),
           count ? "layers count from 0, so the last one is model.layers[" + std::to_string(count - 1) + "]"
                 : "define the layers in the deck; --set can change them but not add them");
    auto* layer_table = layers->get(index)->as_table();
    if (!layer_table) return;  // reading the layers reports the malformed entry with its position
    insert_override_value(*layer_table, field_key, field->kind, raw_value);
    set_by_override_[layer_key(index, field_key)] = override_text;
  }

  // The value is read as TOML (`key = VALUE`); text that is not valid TOML is taken as a plain string, so bare words
  // work (--set precision.mode=bf16). For string keys any bare text is the string (--set run.output=2024 is "2024").
  static void insert_override_value(toml::table& table, const std::string& key, ValueKind kind,
                                    const std::string& raw_value) {
    std::optional<toml::table> parsed;
    try {
      parsed = toml::parse("value = " + raw_value);
    } catch (const toml::parse_error&) {
    }
    const toml::node* node = parsed && parsed->size() == 1 ? parsed->get("value") : nullptr;
    if (!node || (kind == ValueKind::string && !node->is_string()) ||
        (kind == ValueKind::string_array && !node->is_string() && !node->is_array()) ||
        (kind == ValueKind::shuffle && !node->is_string() && !node->is_boolean())) {
      table.insert_or_assign(key, raw_value);
      return;
    }
    node->visit([&](const auto& concrete) { table.insert_or_assign(key, concrete); });
  }

  // ---- reading the tree ----

  void record_position(const std::string& dotted_key, const toml::source_region& region) {
    if (override_for(dotted_key) || region.begin.line == 0) return;
    config_.positions[dotted_key] = position_of(region);
  }

  void read_root(const toml::table& root) {
    for (const auto& [key, node] : in_document_order(root)) {
      const std::string name(key->str());
      const SectionSpec* section = find_section(name);
      const std::string where = location(position_of(key->source()));
      if (!section) unknown_section(where, name, node->is_table(), node->is_array_of_tables());
      const auto* table = node->as_table();
      if (!table)
        fail(where, "'" + name + "' must be a section, got " + describe(*node),
             "write a [" + name + "] header and put its keys below it");
      record_position(name, key->source());
      read_section(*section, *table);
    }
  }

  void read_section(const SectionSpec& section, const toml::table& table) {
    for (const auto& [key, node] : in_document_order(table)) {
      const std::string short_key(key->str());
      const std::string dotted = std::string(section.name) + "." + short_key;
      const FieldSpec* field = find_field(section, short_key);
      if (!field)
        unknown_key(override_for(dotted) ? location(dotted) : location(position_of(key->source())), section, short_key);
      record_position(dotted, key->source());
      if (field->kind == ValueKind::layers) {
        read_layers(*node);
      } else {
        assign(field->kind, field->bind(config_), *node, dotted,
               short_key + " = " + default_literal(section.name, *field));
      }
    }
  }

  // A single value or an array of them (string_array, extents); element(node) is the value, or nullopt for a value
  // of the wrong type.
  template <class T, class Element>
  void read_one_or_array(std::vector<T>& values, const toml::node& node, ValueKind kind, const std::string& dotted_key,
                         const std::string& example, bool empty_allowed, const char* element_kind,
                         const char* element_hint, Element element) const {
    if (const std::optional<T> single = element(node)) {
      values = {*single};
      return;
    }
    const auto* array = node.as_array();
    if (!array || (array->empty() && !empty_allowed)) type_error(dotted_key, kind, node, example);
    values.clear();
    for (std::size_t i = 0; i < array->size(); ++i) {
      const std::optional<T> value = element(*array->get(i));
      if (!value)
        fail(location(dotted_key),
             dotted_key + "[" + std::to_string(i) + "] must be " + element_kind + ", got " + describe(*array->get(i)),
             "write it like " + example + element_hint);
      values.push_back(*value);
    }
  }

  void assign(ValueKind kind, const FieldRef& target, const toml::node& node, const std::string& dotted_key,
              const std::string& example) {
    switch (kind) {
      case ValueKind::integer: {
        const auto* value = node.as_integer();
        if (!value) type_error(dotted_key, kind, node, example);
        if (auto* unsigned_target = std::get_if<std::uint64_t*>(&target)) {
          if (value->get() < 0)
            range_error(dotted_key, ">= 0", std::to_string(value->get()), "use a non-negative integer");
          **unsigned_target = static_cast<std::uint64_t>(value->get());
        } else {
          *std::get<std::int64_t*>(target) = value->get();
        }
        return;
      }
      case ValueKind::number: {
        double number = 0.0;
        if (const auto* integer = node.as_integer()) {
          number = static_cast<double>(integer->get());
        } else if (const auto* floating = node.as_floating_point()) {
          number = floating->get();
        } else {
          type_error(dotted_key, kind, node, example);
        }
        if (!std::isfinite(number))
          range_error(dotted_key, "a finite number", toml_float(number), "inf and nan are not meaningful here");
        *std::get<double*>(target) = number;
        return;
      }
      case ValueKind::boolean: {
        const auto* value = node.as_boolean();
        if (!value) type_error(dotted_key, kind, node, example);
        *std::get<bool*>(target) = value->get();
        return;
      }
      case ValueKind::string: {
        const auto* value = node.as_string();
        if (!value) type_error(dotted_key, kind, node, example);
        if (const auto* choice = std::get_if<ChoiceRef>(&target)) {
          choice->set(choice->field, word_index(dotted_key, value->get(), choice->words));
        } else if (auto* const* limit = std::get_if<TimeLimit*>(&target)) {
          **limit = time_limit_of(dotted_key, value->get());
        } else {
          *std::get<std::string*>(target) = value->get();
        }
        return;
      }
      case ValueKind::string_array: {
        std::vector<std::string> words;
        read_one_or_array(words, node, kind, dotted_key, example, true, "a string", " (strings need quotes)",
                          [](const toml::node& element) {
                            const auto* value = element.as_string();
                            return value ? std::optional<std::string>(value->get()) : std::nullopt;
                          });
        if (const auto* choices = std::get_if<ChoiceListRef>(&target)) {
          std::vector<int> indices;
          for (const std::string& word : words) indices.push_back(word_index(dotted_key, word, choices->words));
          choices->set(choices->field, indices);
        } else {
          *std::get<std::vector<std::string>*>(target) = std::move(words);
        }
        return;
      }
      case ValueKind::shuffle: {
        const ChoiceRef& choice = std::get<ChoiceRef>(target);
        if (const auto* flag = node.as_boolean()) {
          choice.set(choice.field, word_index(dotted_key, flag->get() ? "global" : "none", choice.words));
        } else if (const auto* word = node.as_string()) {
          choice.set(choice.field, word_index(dotted_key, word->get(), choice.words));
        } else {
          type_error(dotted_key, kind, node, "shuffle = true, shuffle = false or shuffle = \"local\"");
        }
        return;
      }
      case ValueKind::loss_scale: {
        std::string text;
        if (const auto* value = node.as_string()) {
          text = value->get();
        } else if (const auto* integer = node.as_integer()) {
          text = std::to_string(integer->get());
        } else if (const auto* floating = node.as_floating_point()) {
          text = toml_float(floating->get());
        } else {
          type_error(dotted_key, kind, node, "loss_scale = \"auto\" or loss_scale = 1024");
        }
        *std::get<LossScaleSetting*>(target) = loss_scale_of(dotted_key, text);
        return;
      }
      case ValueKind::extents: {
        read_one_or_array(*std::get<std::vector<std::int64_t>*>(target), node, kind, dotted_key, example, false,
                          "an integer", " or with one integer per spatial axis, e.g. [3, 3]",
                          [](const toml::node& element) {
                            const auto* value = element.as_integer();
                            return value ? std::optional<std::int64_t>(value->get()) : std::nullopt;
                          });
        return;
      }
      case ValueKind::layers:
        return;  // read by read_layers
    }
  }

  void read_layers(const toml::node& node) {
    const std::string layers_hint =
        "write each layer as a [[model.layers]] table (double brackets), or layers = [ {type = \"linear\", out = 64}, "
        "{type = \"relu\"} ] under [model]";
    const auto* array = node.as_array();
    if (!array)
      fail(location("model.layers"), "model.layers must be an array of tables, got " + describe(node), layers_hint);
    config_.model.layers.assign(array->size(), LayerSpec{});
    layer_keys_given_.assign(array->size(), {});
    for (std::size_t index = 0; index < array->size(); ++index) {
      const toml::node& element = *array->get(index);
      const auto* table = element.as_table();
      const std::string layer_name = layer_key(index, "");
      if (!override_for(layer_name) && element.source().begin.line > 0) {
        config_.model.layers[index].position = position_of(element.source());
        config_.positions[layer_name] = position_of(element.source());
      }
      if (!table) fail(location(layer_name), layer_name + " must be a table, got " + describe(element), layers_hint);
      for (const auto& [key, value] : in_document_order(*table)) {
        const std::string short_key(key->str());
        const std::string dotted = layer_key(index, short_key);
        const LayerFieldSpec* field = find_layer_field(short_key);
        if (!field)
          unknown_layer_key(override_for(dotted) ? location(dotted) : location(position_of(key->source())), index,
                            short_key);
        record_position(dotted, key->source());
        assign(field->kind, field->bind(config_.model.layers[index]), *value, dotted,
               short_key + " = " + default_literal(*field));
        layer_keys_given_[index].push_back(short_key);
      }
    }
  }

  // ---- validation: enumerations, ranges, layers, relations between keys ----

  // The index of `value` among an enumeration's words; anything else is an error suggesting the nearest word.
  int word_index(const std::string& dotted_key, const std::string& value,
                 std::span<const std::string_view> allowed) const {
    if (const auto found = std::find(allowed.begin(), allowed.end(), value); found != allowed.end())
      return static_cast<int>(found - allowed.begin());
    std::vector<Suggestion> candidates;
    for (const auto word : allowed) candidates.push_back({std::string(word), std::string(word)});
    // Other names for our values; spelling distance alone would suggest "cpu" for "gpu".
    static const std::vector<std::pair<std::string_view, std::string_view>> synonyms = {{"gpu", "cuda"},
                                                                                        {"float32", "fp32"},
                                                                                        {"float", "fp32"},
                                                                                        {"bfloat16", "bf16"},
                                                                                        {"float16", "fp16"},
                                                                                        {"half", "fp16"},
                                                                                        {"adam", "adamw"},
                                                                                        {"ce", "cross_entropy"},
                                                                                        {"l2", "mse"},
                                                                                        {"cos", "cosine"},
                                                                                        {"layer_norm", "layernorm"},
                                                                                        {"leakyrelu", "leaky_relu"},
                                                                                        {"fully_connected", "linear"},
                                                                                        {"dense", "linear"}};
    for (const auto& [other_name, word] : synonyms)
      if (lowercase(value) == other_name && std::find(allowed.begin(), allowed.end(), word) != allowed.end())
        candidates.insert(candidates.begin(), {std::string(word), std::string(value)});
    fail(location(dotted_key),
         dotted_key + " must be one of " + join(allowed) + " (got " + toml_string(value) + ")" +
             did_you_mean(closest_name(value, candidates)),
         "set " + dotted_key + " to one of: " + join(allowed));
  }

  // precision.loss_scale: a word or a positive fp32 number (the text of one).
  LossScaleSetting loss_scale_of(const std::string& dotted_key, const std::string& text) const {
    if (text == "auto") return AutoLossScale{};
    if (text == "dynamic") return DynamicLossScale{};
    if (text == "none") return NoLossScale{};
    const auto number = parse_number_text(text);
    // Scales are applied in fp32, so a fixed scale must be a positive fp32 value.
    if (!number || *number <= 0 || *number > largest_float) {
      std::vector<Suggestion> candidates;
      for (const auto word : loss_scale_words) candidates.push_back({std::string(word), std::string(word)});
      fail(location(dotted_key),
           "precision.loss_scale must be auto, dynamic, none or a positive number up to 3.4028235e+38 (got " +
               toml_string(text) + ")" + (number ? "" : did_you_mean(closest_name(text, candidates))),
           "auto means dynamic for fp16 and none otherwise; a number is a fixed scale, e.g. loss_scale = 1024");
    }
    return FixedLossScale{*number};
  }

  // train.time_limit: "" (none) or "HH:MM:SS" / "MM:SS".
  TimeLimit time_limit_of(const std::string& dotted_key, const std::string& text) const {
    if (text.empty()) return {};
    const auto seconds = time_limit_seconds(text);
    if (!seconds)
      range_error(dotted_key, "\"HH:MM:SS\", \"MM:SS\" (minutes and seconds below 60, more than zero in all) or \"\"",
                  toml_string(text), "e.g. time_limit = \"11:50:00\"; \"\" means no limit");
    return TimeLimit{static_cast<double>(*seconds), text};
  }

  // Range checks name the rule and the default, which is always a valid value.
  // Counts and sizes stop at 2^31 - 1: steps key the 32-bit random streams, and products of such values (rows x
  // width, epochs x steps per epoch) stay far from int64 overflow.
  void check_integer(const std::string& dotted_key, std::int64_t value, std::int64_t minimum,
                     std::int64_t maximum = max_count) const {
    if (value >= minimum && value <= maximum) return;
    const std::string rule = value < minimum ? ">= " + std::to_string(minimum) : "<= " + std::to_string(maximum);
    range_error(dotted_key, rule, std::to_string(value), "use an integer " + rule + default_hint(dotted_key));
  }

  void check_number(const std::string& dotted_key, double value, bool ok, const std::string& rule) const {
    if (ok) return;
    range_error(dotted_key, rule, shortest_number_text(value), "use a value " + rule + default_hint(dotted_key));
  }

  std::string default_hint(const std::string& dotted_key) const {
    const auto dot = dotted_key.find('.');
    if (dotted_key.rfind("model.layers[", 0) == 0) {
      const auto* field = find_layer_field(dotted_key.substr(dotted_key.rfind('.') + 1));
      return field ? " (default " + default_literal(*field) + ")" : std::string{};
    }
    const SectionSpec* section = find_section(dotted_key.substr(0, dot));
    const FieldSpec* field = section ? find_field(*section, dotted_key.substr(dot + 1)) : nullptr;
    return field ? " (default " + default_literal(section->name, *field) + ")" : std::string{};
  }

  void validate() {
    const RunConfig& config = config_;
    check_integer("run.threads", config.run.threads, 0);
    if (override_for("run.output") || config.positions.count("run.output"))
      if (config.run.output.empty())
        range_error("run.output", "a directory path", "an empty string",
                    "leave run.output out to get runs/<deck name>");

    validate_layers();

    if (std::all_of(config.data.train.begin(), config.data.train.end(), [](const auto& f) { return f.empty(); }))
      fail(location("data.train"), "data.train is missing: the training data file is required",
           "add under [data]: train = \"path/to/train.h5\" (relative paths are resolved as described in "
           "docs/input-reference.md)");
    for (const std::string key : {"data.features", "data.labels", "data.targets"}) {
      const std::string& value = key == "data.features" ? config.data.features
                                 : key == "data.labels" ? config.data.labels
                                                        : config.data.targets;
      if (value.empty())
        range_error(key, "an HDF5 dataset path", "an empty string", "use a dataset path such as \"/features\"");
    }
    check_integer("data.batch_size", config.data.batch_size, 1);
    check_integer("data.eval_batch_size", config.data.eval_batch_size, 0);
    check_integer("data.prefetch", config.data.prefetch, 0);
    check_number("data.scale", config.data.scale, config.data.scale != 0, "a non-zero number");

    check_integer("train.steps", config.train.steps, 0);
    check_integer("train.epochs", config.train.epochs, 0);
    if (config.train.steps == 0 && config.train.epochs == 0) {
      const std::string where =
          location(config.positions.count("train.steps") || override_for("train.steps")     ? "train.steps"
                   : config.positions.count("train.epochs") || override_for("train.epochs") ? "train.epochs"
                                                                                            : "train");
      fail(where, "train.steps and train.epochs are both 0: set exactly one of them to a positive number",
           "add under [train]: steps = 1000 (optimizer steps) or epochs = 10 (passes over data.train)");
    }
    if (config.train.steps > 0 && config.train.epochs > 0) {
      const std::string key = override_for("train.steps") ? "train.steps" : "train.epochs";
      fail(location(key),
           "train.steps (" + std::to_string(config.train.steps) + ") and train.epochs (" +
               std::to_string(config.train.epochs) + ") are both set: set exactly one of them",
           "remove one of them (or set it to 0, e.g. --set train.epochs=0)");
    }
    check_integer("train.log_every", config.train.log_every, 1);
    check_integer("train.eval_every", config.train.eval_every, 0);
    check_integer("train.accumulate", config.train.accumulate, 1);

    const CheckpointSection& checkpoint = config.checkpoint;
    check_integer("checkpoint.every_steps", checkpoint.every_steps, 0);
    check_number("checkpoint.every_seconds", checkpoint.every_seconds, checkpoint.every_seconds >= 0, ">= 0");
    check_integer("checkpoint.keep", checkpoint.keep, 0);

    const OptimizerSection& optimizer = config.optimizer;
    check_number("optimizer.lr", optimizer.lr, optimizer.lr > 0, "> 0");
    check_number("optimizer.weight_decay", optimizer.weight_decay, optimizer.weight_decay >= 0, ">= 0");
    check_number("optimizer.beta1", optimizer.beta1, optimizer.beta1 >= 0 && optimizer.beta1 < 1, "in [0, 1)");
    check_number("optimizer.beta2", optimizer.beta2, optimizer.beta2 >= 0 && optimizer.beta2 < 1, "in [0, 1)");
    check_number("optimizer.eps", optimizer.eps, optimizer.eps > 0, "> 0");
    check_number("optimizer.momentum", optimizer.momentum, optimizer.momentum >= 0, ">= 0");
    check_number("optimizer.grad_clip", optimizer.grad_clip, optimizer.grad_clip >= 0, ">= 0");
    if (optimizer.type == OptimizerKind::sgd && optimizer.nesterov && optimizer.momentum == 0)
      fail(location("optimizer.nesterov"), "optimizer.nesterov = true needs optimizer.momentum > 0 (it is 0)",
           "set optimizer.momentum, e.g. momentum = 0.9, or remove nesterov");

    const ScheduleSection& schedule = config.schedule;
    check_integer("schedule.warmup_steps", schedule.warmup_steps, 0);
    check_number("schedule.min_lr", schedule.min_lr, schedule.min_lr >= 0, ">= 0");
    if (schedule.type == ScheduleKind::cosine && schedule.min_lr > optimizer.lr)
      fail(location("schedule.min_lr"),
           "schedule.min_lr (" + shortest_number_text(schedule.min_lr) + ") is larger than optimizer.lr (" +
               shortest_number_text(optimizer.lr) + "): a cosine schedule decays from lr down to min_lr",
           "use a schedule.min_lr <= optimizer.lr");
    check_integer("schedule.step_size", schedule.step_size, 1);
    check_number("schedule.gamma", schedule.gamma, schedule.gamma > 0, "> 0");

    const PrecisionSection& precision = config.precision;
    check_number("precision.init_scale", precision.init_scale,
                 precision.init_scale > 0 && precision.init_scale <= largest_float, "in (0, 3.4028235e+38]");
    check_number("precision.growth_factor", precision.growth_factor, precision.growth_factor > 1, "> 1");
    check_number("precision.backoff_factor", precision.backoff_factor,
                 precision.backoff_factor > 0 && precision.backoff_factor < 1, "in (0, 1)");
    check_integer("precision.growth_interval", precision.growth_interval, 1);
    check_integer("precision.max_skipped_steps", precision.max_skipped_steps, 1);
  }

  void validate_layers() {
    auto& layers = config_.model.layers;
    if (layers.empty())
      fail(location("model.layers"),
           "model.layers is " +
               std::string(config_.positions.count("model.layers") || override_for("model.layers") ? "empty"
                                                                                                   : "missing") +
               ": the model needs at least one layer",
           "add layers, for example:\n[[model.layers]]\ntype = \"linear\"\nout = 64\n\n[[model.layers]]\ntype = "
           "\"relu\"");
    std::map<std::string, std::size_t> index_by_name;
    for (std::size_t index = 0; index < layers.size(); ++index) {
      LayerSpec& layer = layers[index];
      const std::string table_key = layer_key(index, "");
      const auto& given = layer_keys_given_[index];
      if (std::find(given.begin(), given.end(), "type") == given.end())
        fail(location(table_key), table_key + " has no type",
             "add type = \"...\" with one of: " + join(choice_words<LayerType>()));
      const std::string type_word(word_of(layer.type));  // checked when read
      const LayerTypeSpec* type = find_layer_type(layer.type);

      for (const auto& key : given) {
        if (layer_type_accepts(*type, key)) continue;
        std::vector<std::string_view> owners;
        for (const auto& other : layer_types())
          if (layer_type_accepts(other, key)) owners.push_back(word_of(other.type));
        std::vector<std::string_view> accepted = {"type", "name"};
        accepted.insert(accepted.end(), type->keys.begin(), type->keys.end());
        fail(location(layer_key(index, key)),
             layer_key(index, key) + " does not apply to a " + type_word + " layer (" + key + " is for " +
                 join(owners, " and ") + " layers)",
             "remove it; a " + type_word + " layer takes: " + join(accepted));
      }
      if (layer.type == LayerType::linear) {
        if (std::find(given.begin(), given.end(), "out") == given.end())
          fail(location(table_key), table_key + " (linear) needs out, its number of output features",
               "add out = <number of output features>, e.g. out = 64");
        check_integer(layer_key(index, "out"), layer.out, 1);
        check_integer(layer_key(index, "in"), layer.in, 0);
      }
      if (layer.type == LayerType::dropout)
        check_number(layer_key(index, "p"), layer.p, layer.p >= 0 && layer.p < 1, "in [0, 1)");
      if (layer.type == LayerType::layernorm || layer.type == LayerType::groupnorm)
        check_number(layer_key(index, "eps"), layer.eps, layer.eps > 0, "> 0");
      validate_spatial_layer(index, layer, given);

      if (std::find(given.begin(), given.end(), "name") == given.end()) {
        layer.name = type_word + std::to_string(index);
      } else if (layer.name.empty() ||
                 layer.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                     std::string::npos) {
        range_error(layer_key(index, "name"), "made of letters, digits, _ and -", toml_string(layer.name),
                    "names label the layer's parameters in logs and checkpoints; e.g. name = \"encoder_1\"");
      }
      const auto [existing, inserted] = index_by_name.emplace(layer.name, index);
      if (!inserted) {
        const std::string first = layer_key(existing->second, "");
        fail(location(std::find(given.begin(), given.end(), "name") != given.end() ? layer_key(index, "name")
                                                                                   : table_key),
             "duplicate layer name '" + layer.name + "': " + table_key + " and " + first + " (" + location(first) +
                 ") both use it",
             "give every layer a unique name; a layer without a name is called <type><index>, e.g. linear0");
      }
    }
  }

  // conv, pooling and groupnorm keys: required keys present, extents with one value or one per spatial axis, ranges,
  // and the stride default (1 for conv, the kernel for pooling).
  void validate_spatial_layer(std::size_t index, LayerSpec& layer, const std::vector<std::string>& given) const {
    const auto has = [&](std::string_view key) { return std::find(given.begin(), given.end(), key) != given.end(); };
    const std::string table_key = layer_key(index, "");
    const bool conv = is_convolution(layer.type), pool = is_window_pooling(layer.type);
    const std::string type_word(word_of(layer.type));
    if (layer.type == LayerType::groupnorm) {
      if (!has("groups"))
        fail(location(table_key), table_key + " (groupnorm) needs groups, the number of channel groups",
             "add groups = <a divisor of the channel count>, e.g. groups = 4 (1 normalises over all channels)");
      check_integer(layer_key(index, "groups"), layer.groups, 1);
      return;
    }
    if (!conv && !pool) return;
    const auto axes = static_cast<std::size_t>(window_axes(layer.type));
    if (conv) {
      if (!has("out"))
        fail(location(table_key), table_key + " (" + type_word + ") needs out, its number of output channels",
             "add out = <number of output channels>, e.g. out = 16");
      check_integer(layer_key(index, "out"), layer.out, 1);
      check_integer(layer_key(index, "groups"), layer.groups, 1);
    }
    if (!has("kernel"))
      fail(location(table_key), table_key + " (" + type_word + ") needs kernel, the window size",
           "add kernel = 3 (the same on every axis) or one value per axis, e.g. kernel = " +
               std::string(axes == 2 ? "[3, 3]" : "[3, 3, 3]"));
    if (!has("stride")) layer.stride = conv ? std::vector<std::int64_t>{1} : layer.kernel;
    for (const auto& [key, values, minimum] :
         {std::tuple<const char*, std::vector<std::int64_t>*, std::int64_t>{"kernel", &layer.kernel, 1},
          {"stride", &layer.stride, 1},
          {"padding", &layer.padding, 0},
          {"dilation", &layer.dilation, 1}}) {
      const std::string dotted = layer_key(index, key);
      if (values->size() != 1 && values->size() != axes)
        fail(location(dotted),
             dotted + " has " + std::to_string(values->size()) + " values; a " + type_word + " layer has " +
                 std::to_string(axes) + " spatial axes",
             "give one value for every axis or exactly " + std::to_string(axes) + ", e.g. " + key + " = " +
                 (axes == 2 ? "[2, 2]" : "[2, 2, 2]"));
      for (const auto value : *values)
        if (value < minimum)
          range_error(dotted, ">= " + std::to_string(minimum), toml_literal(FieldRef{values}),
                      "use integers >= " + std::to_string(minimum) + default_hint(dotted));
    }
    if (pool)
      for (std::size_t axis = 0; axis < axes; ++axis) {
        const auto at = [axis](const std::vector<std::int64_t>& values) {
          return values.size() == 1 ? values[0] : values[axis];
        };
        if (2 * at(layer.padding) > at(layer.kernel))
          fail(location(layer_key(index, "padding")),
               layer_key(index, "padding") + " (" + std::to_string(at(layer.padding)) +
                   ") is more than half the kernel (" + std::to_string(at(layer.kernel)) +
                   "): some windows would hold only padding",
               "use padding <= kernel / 2, as PyTorch requires");
      }
  }

  // ---- defaults that depend on the deck, and data paths ----

  // Relative data paths: used as they are when they exist from the current directory, otherwise taken relative to the
  // deck's directory. Either way the result is made absolute, so the resolved deck (to_toml) reads the same data
  // from wherever it is loaded.
  // A glob pattern counts as existing from the current directory when it matches something there.
  std::string resolve_data_path(const std::string& path) const {
    namespace fs = std::filesystem;
    if (path.empty()) return path;
    const fs::path given(path);
    if (given.is_absolute()) return given.lexically_normal().string();
    std::error_code error;
    bool here = false;
    if (path.find_first_of("*?[") != std::string::npos) {  // a glob pattern (see data/data_files.hpp)
      glob_t matches{};
      here = glob(path.c_str(), 0, nullptr, &matches) == 0 && matches.gl_pathc > 0;
      globfree(&matches);
    } else {
      here = fs::exists(given, error);
    }
    if (here) return fs::absolute(given, error).lexically_normal().string();
    return fs::absolute(fs::path(deck_path_).parent_path() / given, error).lexically_normal().string();
  }

  void resolve_data_paths(std::string& path) const { path = resolve_data_path(path); }
  // An empty entry means "no file" (validation = "" is the way to switch validation off): dropped.
  void resolve_data_paths(std::vector<std::string>& paths) const {
    std::erase(paths, std::string());
    for (auto& path : paths) path = resolve_data_path(path);
  }

  void fill_defaults_and_resolve_paths() {
    if (config_.run.output.empty()) {
      std::string stem = std::filesystem::path(deck_path_).stem().string();
      config_.run.output = "runs/" + (stem.empty() ? std::string("deck") : stem);
    }
    resolve_data_paths(config_.data.train);
    resolve_data_paths(config_.data.validation);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// Public functions
// ---------------------------------------------------------------------------------------------------------------------

std::string RunConfig::where(const std::string& dotted_key) const {
  const auto it = positions.find(dotted_key);
  if (it == positions.end() || it->second.line <= 0) return deck_path;
  return deck_path + ":" + std::to_string(it->second.line) + ":" + std::to_string(it->second.column);
}

RunConfig parse_run_config(const std::string& deck_text, const std::string& deck_path,
                           const std::vector<std::string>& overrides) {
  return DeckReader(deck_path).read(deck_text, overrides);
}

RunConfig load_run_config(const std::string& deck_path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code error;
  const std::string cwd = fs::current_path(error).string();
  const auto status = fs::status(deck_path, error);
  if (!fs::exists(status))
    throw InputError(deck_path + ": the input deck does not exist",
                     "check the path; a relative path is taken from the current directory (" + cwd + ")");
  if (fs::is_directory(status))
    throw InputError(deck_path + ": is a directory, not an input deck",
                     "pass the deck's TOML file, e.g. " + (fs::path(deck_path) / "deck.toml").string());
  require_regular_file(deck_path, "input deck");
  std::ifstream file(deck_path, std::ios::binary);
  if (!file)
    throw InputError(deck_path + ": cannot read the input deck (" + std::strerror(errno) + ")",
                     "check the file's permissions");
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw InputError(deck_path + ": reading the input deck failed", "check the file and its file system");
  return parse_run_config(text.str(), deck_path, overrides);
}

std::string to_toml(const RunConfig& config) {
  RunConfig copy = config;  // the field bindings need a mutable config; nothing is changed
  std::ostringstream out;
  std::string source = config.deck_path;
  std::replace_if(
      source.begin(), source.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }, '?');
  out << "# Resolved hpctrain input deck: every key with its value, defaults filled in.\n";
  out << "# Read from: " << source << "\n";
  for (const auto& section : schema()) {
    out << "\n[" << section.name << "]\n";
    for (const auto& field : section.fields) {
      if (field.kind == ValueKind::layers) continue;  // written after the section's plain keys, as [[model.layers]]
      out << field.key << " = " << toml_literal(field.kind, field.bind(copy)) << "\n";
    }
    if (section.name != "model") continue;
    for (auto& layer : copy.model.layers) {
      out << "\n[[model.layers]]\n";
      const LayerTypeSpec* type = find_layer_type(layer.type);
      for (const auto& field : layer_fields())
        if (type ? layer_type_accepts(*type, field.key) : (field.key == "type" || field.key == "name"))
          out << field.key << " = " << toml_literal(field.bind(layer)) << "\n";
    }
  }
  return out.str();
}

std::vector<std::string> accepted_keys() {
  std::vector<std::string> keys;
  for (const auto& section : schema())
    for (const auto& field : section.fields) keys.push_back(std::string(section.name) + "." + std::string(field.key));
  for (const auto& field : layer_fields()) keys.push_back("model.layers[]." + std::string(field.key));
  return keys;
}

}  // namespace hpctrain
