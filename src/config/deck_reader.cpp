// Reading a deck: the TOML tree and --set overrides against the schema, with errors that name the position.
#include "deck_reader.hpp"

#include <algorithm>
#include <charconv>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/suggestions.hpp"
#include "toml_text.hpp"

namespace hpctrain::deck {

RunConfig DeckReader::read(std::string_view deck_text, const std::vector<std::string>& overrides) {
  toml::table root = parse_deck(deck_text);
  for (const auto& override_text : overrides) apply_override(root, override_text);
  read_root(root);
  validate();
  fill_defaults_and_resolve_paths();
  return std::move(config_);
}

void DeckReader::fail(const std::string& where, const std::string& problem, const std::string& hint) const {
  throw InputError(where + ": " + problem, hint);
}

std::string DeckReader::location(const SourcePosition& position) const {
  if (position.line <= 0) return deck_path_;
  return deck_path_ + ":" + std::to_string(position.line) + ":" + std::to_string(position.column);
}

const std::string* DeckReader::override_for(const std::string& dotted_key) const {
  if (auto it = set_by_override_.find(dotted_key); it != set_by_override_.end()) return &it->second;
  // Everything inside a model.layers array given by --set came from that --set.
  if (dotted_key.rfind("model.layers[", 0) == 0)
    if (auto it = set_by_override_.find("model.layers"); it != set_by_override_.end()) return &it->second;
  return nullptr;
}

std::string DeckReader::location(const std::string& dotted_key) const {
  if (const auto* override_text = override_for(dotted_key)) return "--set " + *override_text;
  const auto it = config_.positions.find(dotted_key);
  return location(it == config_.positions.end() ? SourcePosition{} : it->second);
}

std::string DeckReader::default_literal(std::string_view section_name, const FieldSpec& field) {
  RunConfig defaults;
  return example_literal(std::string(section_name) + "." + std::string(field.key),
                         toml_literal(field.kind, field.bind(defaults)));
}

std::string DeckReader::default_literal(const LayerFieldSpec& field) {
  LayerSpec defaults;
  return example_literal("model.layers[]." + std::string(field.key), toml_literal(field.bind(defaults)));
}

void DeckReader::type_error(const std::string& dotted_key, ValueKind kind, const toml::node& node,
                            const std::string& example) const {
  fail(location(dotted_key),
       dotted_key + " must be " + std::string(expected_description(kind)) + ", got " + describe(node),
       "write it like " + example +
           (kind == ValueKind::string || kind == ValueKind::string_array ? " (strings need quotes)"
            : kind == ValueKind::shuffle                                 ? ""
                                                                         : " (no quotes)"));
}

void DeckReader::range_error(const std::string& dotted_key, const std::string& rule, const std::string& got,
                             const std::string& hint) const {
  fail(location(dotted_key), dotted_key + " must be " + rule + " (got " + got + ")", hint);
}

void DeckReader::unknown_key(const std::string& where, const SectionSpec& section, std::string_view key) const {
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

void DeckReader::unknown_section(const std::string& where, std::string_view name, bool is_table,
                                 bool is_array_of_tables) const {
  std::vector<Suggestion> candidates;
  std::vector<std::string> section_names;
  for (const auto& section : schema()) {
    std::string header = "[";  // (appended: GCC 12's -Wrestrict misfires on "[" + string + "]")
    header.append(section.name).append("]");
    candidates.push_back({header, std::string(section.name)});
    section_names.push_back(header);
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

void DeckReader::unknown_layer_key(const std::string& where, const std::string& table_key, std::string_view key) const {
  std::vector<Suggestion> candidates;
  for (const auto& field : layer_fields())
    candidates.push_back({dotted_layer_key(table_key, field.key), std::string(field.key)});
  fail(where, "unknown key '" + dotted_layer_key(table_key, key) + "'" + did_you_mean(closest_name(key, candidates)),
       "valid layer keys: " + join(all_layer_keys()) + " (which ones a layer takes depends on its type)");
}

toml::table DeckReader::parse_deck(std::string_view deck_text) const {
  try {
    return toml::parse(deck_text, std::string_view(deck_path_));
  } catch (const toml::parse_error& error) {
    fail(location(position_of(error.source())), "TOML syntax error: " + std::string(error.description()),
         "fix the TOML at that line and column (strings need quotes, e.g. device = \"cpu\"; see "
         "docs/input-reference.md)");
  }
}

void DeckReader::apply_override(toml::table& root, const std::string& override_text) {
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

void DeckReader::apply_layer_override(toml::table& root, const std::string& where, const std::string& key,
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
  if (field_key.rfind("layers[", 0) == 0)
    fail(where, "--set cannot change one layer inside a residual block yet",
         "edit the deck, or give the whole branch: --set 'model.layers[" + std::to_string(index) +
             "].layers=[{type = \"linear\", out = 64}, {type = \"relu\"}]'");
  const LayerFieldSpec* field = find_layer_field(field_key);
  if (!field) unknown_layer_key(where, layer_key(index, ""), field_key);

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

void DeckReader::insert_override_value(toml::table& table, const std::string& key, ValueKind kind,
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

void DeckReader::record_position(const std::string& dotted_key, const toml::source_region& region) {
  if (override_for(dotted_key) || region.begin.line == 0) return;
  config_.positions[dotted_key] = position_of(region);
}

void DeckReader::read_root(const toml::table& root) {
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

void DeckReader::read_section(const SectionSpec& section, const toml::table& table) {
  for (const auto& [key, node] : in_document_order(table)) {
    const std::string short_key(key->str());
    const std::string dotted = std::string(section.name) + "." + short_key;
    const FieldSpec* field = find_field(section, short_key);
    if (!field)
      unknown_key(override_for(dotted) ? location(dotted) : location(position_of(key->source())), section, short_key);
    record_position(dotted, key->source());
    if (field->kind == ValueKind::layers) {
      read_layers(*node, dotted, config_.model.layers);
    } else {
      assign(field->kind, field->bind(config_), *node, dotted,
             short_key + " = " + default_literal(section.name, *field));
    }
  }
}

void DeckReader::assign(ValueKind kind, const FieldRef& target, const toml::node& node, const std::string& dotted_key,
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
    case ValueKind::seconds_or_off:
      if (const auto* flag = node.as_boolean()) {  // false turns it off; true names no duration
        if (flag->get()) type_error(dotted_key, kind, node, example);
        *std::get<double*>(target) = 0.0;
        return;
      }
      [[fallthrough]];
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
    case ValueKind::number_array: {
      auto& values = *std::get<std::vector<double>*>(target);
      read_one_or_array(values, node, kind, dotted_key, example, true, "a number", "",
                        [](const toml::node& element) -> std::optional<double> {
                          if (const auto* integer = element.as_integer()) return static_cast<double>(integer->get());
                          if (const auto* floating = element.as_floating_point()) return floating->get();
                          return std::nullopt;
                        });
      for (const double value : values)
        if (!std::isfinite(value))
          range_error(dotted_key, "finite numbers", toml_float(value), "inf and nan are not meaningful here");
      return;
    }
    case ValueKind::layers:
      return;  // read by read_layers
  }
}

void DeckReader::read_layers(const toml::node& node, const std::string& list_key, std::vector<LayerSpec>& layers) {
  const bool branch = list_key != "model.layers";
  const std::string layers_hint =
      branch ? "write the block's branch as layers = [ {type = \"linear\", out = 64}, {type = \"relu\"} ] (inline "
               "tables), or as [[model.layers.layers]] tables after the block's [[model.layers]]"
             : "write each layer as a [[model.layers]] table (double brackets), or layers = [ {type = \"linear\", out "
               "= 64}, {type = \"relu\"} ] under [model]";
  const auto* array = node.as_array();
  if (!array) fail(location(list_key), list_key + " must be an array of tables, got " + describe(node), layers_hint);
  layers.assign(array->size(), LayerSpec{});
  for (std::size_t index = 0; index < array->size(); ++index) {
    const toml::node& element = *array->get(index);
    const auto* table = element.as_table();
    const std::string table_key = layer_table_key(list_key, index);
    LayerSpec& layer = layers[index];
    if (!override_for(table_key) && element.source().begin.line > 0) {
      layer.position = position_of(element.source());
      config_.positions[table_key] = position_of(element.source());
    }
    if (!table) fail(location(table_key), table_key + " must be a table, got " + describe(element), layers_hint);
    auto& given = layer_keys_given_[table_key];
    given.clear();
    for (const auto& [key, value] : in_document_order(*table)) {
      const std::string short_key(key->str());
      const std::string dotted = dotted_layer_key(table_key, short_key);
      const LayerFieldSpec* field = find_layer_field(short_key);
      if (!field)
        unknown_layer_key(override_for(dotted) ? location(dotted) : location(position_of(key->source())), table_key,
                          short_key);
      record_position(dotted, key->source());
      if (field->kind == ValueKind::layers)
        read_layers(*value, dotted, layer.layers);
      else
        assign(field->kind, field->bind(layer), *value, dotted, short_key + " = " + default_literal(*field));
      given.push_back(short_key);
    }
  }
}

}  // namespace hpctrain::deck
