// TOML text for the deck reader, private to src/config: values formatted for messages and to_toml, TOML nodes
// described for "expected X, got Y", the time-limit and number texts, source positions, keys in document order.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deck_schema.hpp"
#include "hpctrain/core/numbers.hpp"

namespace hpctrain::deck {

// Shortest text that reads back as the same double ("0.1", "1e-08", "65536"): core's.
using hpctrain::shortest_number_text;

// A TOML float literal: like shortest_number_text but always recognisably a float ("3.0", not "3").
std::string toml_float(double value);

// A TOML basic string literal with the characters TOML requires escaped.
std::string toml_string(std::string_view text);

// The TOML literal for a field's current value (loss_scale is always written as a string: "auto", "1024", ...).
std::string toml_literal(const FieldRef& target);

// The TOML literal of a field as to_toml writes it: data.shuffle's words global/none are written as true/false.
std::string toml_literal(ValueKind kind, const FieldRef& target);

// A short description of what a TOML value is, for "expected X, got Y" messages.
std::string describe(const toml::node& node);

std::string_view expected_description(ValueKind kind);

// Example values for keys whose default is empty, so that type-error hints always show something writable.
std::string example_literal(std::string_view dotted_key, const std::string& default_literal);

// The number a loss_scale text means, when it is one (whole text, finite).
std::optional<double> parse_number_text(std::string_view text);

// train.time_limit in seconds: "H:MM:SS" (any number of hour digits) or "M:SS" (any number of minute digits), with
// two-digit minutes and seconds below 60 after a colon; nullopt for anything else, or for a total of zero.
std::optional<std::int64_t> time_limit_seconds(std::string_view text);

std::string trim(std::string_view text);

SourcePosition position_of(const toml::source_region& region);

// A table's entries in the order they were written (toml++ keeps keys sorted); keys without a source position
// (inserted by --set) come last.
std::vector<std::pair<const toml::key*, const toml::node*>> in_document_order(const toml::table& table);

std::string layer_key(std::size_t index, std::string_view key);
// "model.layers[2].layers[0]": entry `index` of the layer list `list_key`; and a key of a layer table.
std::string layer_table_key(const std::string& list_key, std::size_t index);
std::string dotted_layer_key(const std::string& table_key, std::string_view key);

}  // namespace hpctrain::deck
