// The deck reader, private to src/config: a TOML deck plus --set overrides in, a validated RunConfig out.
// Reading (deck_reader.cpp) walks the TOML tree against the schema and turns enumerated and structured values into
// their types as it goes; validation (deck_validation.cpp) checks ranges, layers and relations between keys, then
// fills the defaults that depend on the deck and resolves data paths.
//
// Every error is an InputError whose message starts with where the value came from ("deck.toml:12:5" or
// "--set optimizer.lr=-1"), names the key, and says what would be valid; the hint says what to write instead.
#pragma once

#include <toml++/toml.h>

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deck_schema.hpp"
#include "toml_text.hpp"

namespace hpctrain::deck {

class DeckReader {
 public:
  explicit DeckReader(std::string deck_path) : deck_path_(std::move(deck_path)) { config_.deck_path = deck_path_; }

  RunConfig read(std::string_view deck_text, const std::vector<std::string>& overrides);

 private:
  std::string deck_path_;
  RunConfig config_;
  std::map<std::string, std::string> set_by_override_;  // dotted key -> the --set argument that gave its value
  // per layer table ("model.layers[2]", "model.layers[2].layers[0]"), the keys the deck or --set wrote
  std::map<std::string, std::vector<std::string>> layer_keys_given_;

  // ---- errors ----

  [[noreturn]] void fail(const std::string& where, const std::string& problem, const std::string& hint) const;

  std::string location(const SourcePosition& position) const;

  const std::string* override_for(const std::string& dotted_key) const;

  // "deck.toml:12:5", "--set optimizer.lr=-1", or just the deck path for a default.
  std::string location(const std::string& dotted_key) const;

  // The default of a key as TOML text ("0.001", "\"cpu\""), for hints.
  static std::string default_literal(std::string_view section_name, const FieldSpec& field);

  static std::string default_literal(const LayerFieldSpec& field);

  [[noreturn]] void type_error(const std::string& dotted_key, ValueKind kind, const toml::node& node,
                               const std::string& example) const;

  [[noreturn]] void range_error(const std::string& dotted_key, const std::string& rule, const std::string& got,
                                const std::string& hint) const;

  [[noreturn]] void unknown_key(const std::string& where, const SectionSpec& section, std::string_view key) const;

  // is_table: written as [name] (or name.key = ...); is_array_of_tables: as [[name]]; neither: a plain key.
  [[noreturn]] void unknown_section(const std::string& where, std::string_view name, bool is_table,
                                    bool is_array_of_tables = false) const;

  [[noreturn]] void unknown_layer_key(const std::string& where, const std::string& table_key,
                                      std::string_view key) const;

  // ---- TOML text ----

  toml::table parse_deck(std::string_view deck_text) const;

  // ---- --set overrides: applied to the parsed TOML tree, so they pass through exactly the same checks ----

  void apply_override(toml::table& root, const std::string& override_text);

  void apply_layer_override(toml::table& root, const std::string& where, const std::string& key,
                            const std::string& raw_value, const std::string& override_text);

  // The value is read as TOML (`key = VALUE`); text that is not valid TOML is taken as a plain string, so bare words
  // work (--set precision.mode=bf16). For string keys any bare text is the string (--set run.output=2024 is "2024").
  static void insert_override_value(toml::table& table, const std::string& key, ValueKind kind,
                                    const std::string& raw_value);

  // ---- reading the tree ----

  void record_position(const std::string& dotted_key, const toml::source_region& region);

  void read_root(const toml::table& root);

  void read_section(const SectionSpec& section, const toml::table& table);

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
              const std::string& example);

  // A list of layers: model.layers, or a residual block's branch (list_key "model.layers[2].layers").
  void read_layers(const toml::node& node, const std::string& list_key, std::vector<LayerSpec>& layers);

  // ---- validation: enumerations, ranges, layers, relations between keys ----

  // The index of `value` among an enumeration's words; anything else is an error suggesting the nearest word.
  int word_index(const std::string& dotted_key, const std::string& value,
                 std::span<const std::string_view> allowed) const;

  // precision.loss_scale: a word or a positive fp32 number (the text of one).
  LossScaleSetting loss_scale_of(const std::string& dotted_key, const std::string& text) const;

  // train.time_limit: "" (none) or "HH:MM:SS" / "MM:SS".
  TimeLimit time_limit_of(const std::string& dotted_key, const std::string& text) const;

  // Range checks name the rule and the default, which is always a valid value.
  // Counts and sizes stop at 2^31 - 1: steps key the 32-bit random streams, and products of such values (rows x
  // width, epochs x steps per epoch) stay far from int64 overflow.
  void check_integer(const std::string& dotted_key, std::int64_t value, std::int64_t minimum,
                     std::int64_t maximum = max_count) const;

  void check_number(const std::string& dotted_key, double value, bool ok, const std::string& rule) const;

  std::string default_hint(const std::string& dotted_key) const;

  void validate();

  void validate_layers();
  // One list of layers: model.layers (block_key empty) or the branch of the residual block at block_key. Fills in
  // default names (<type><index in the list>).
  void validate_layer_list(std::vector<LayerSpec>& layers, const std::string& list_key, const std::string& block_key);
  // linear layers' tie: an existing embedding, out equal to its vocabulary (filled in when not given).
  void validate_ties(const std::map<std::string, std::size_t>& index_by_name);
  // model.class_weights and model.label_smoothing: cross-entropy only, positive weights, smoothing in [0, 1).
  void validate_loss();
  // Intervals in steps or epochs, checkpoint.best_metric against the task, early stopping's keys.
  void validate_intervals_and_best();

  // conv, pooling and groupnorm keys: required keys present, extents with one value or one per spatial axis, ranges,
  // and the stride default (1 for conv, the kernel for pooling).
  void validate_spatial_layer(const std::string& table_key, LayerSpec& layer,
                              const std::vector<std::string>& given) const;

  // ---- defaults that depend on the deck, and data paths ----

  // Relative data paths: used as they are when they exist from the current directory, otherwise taken relative to the
  // deck's directory. Either way the result is made absolute, so the resolved deck (to_toml) reads the same data
  // from wherever it is loaded.
  // A glob pattern counts as existing from the current directory when it matches something there.
  std::string resolve_data_path(const std::string& path) const;

  void resolve_data_paths(std::string& path) const { path = resolve_data_path(path); }
  // An empty entry means "no file" (validation = "" is the way to switch validation off): dropped.
  void resolve_data_paths(std::vector<std::string>& paths) const;

  void fill_defaults_and_resolve_paths();
};

}  // namespace hpctrain::deck
