// The public face of the deck reader (deck_reader.hpp): loading a deck file, parsing deck text, the resolved deck as
// TOML, and the list of accepted keys.
#include "hpctrain/config/run_config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "deck_reader.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "toml_text.hpp"

namespace hpctrain {

using namespace deck;  // the reader's internals (src/config only)

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

namespace {

// The keys a layer's type takes, with their TOML literals; a residual's branch is an array of inline tables.
std::vector<std::pair<std::string_view, std::string>> layer_values(LayerSpec& layer) {
  std::vector<std::pair<std::string_view, std::string>> values;
  const LayerTypeSpec* type = find_layer_type(layer.type);
  for (const auto& field : layer_fields()) {
    if (type ? !layer_type_accepts(*type, field.key) : (field.key != "type" && field.key != "name")) continue;
    if (field.kind != ValueKind::layers) {
      values.emplace_back(field.key, toml_literal(field.bind(layer)));
      continue;
    }
    std::string branch = "[\n";
    for (auto& inner : layer.layers) {
      std::string table;
      for (const auto& [key, value] : layer_values(inner))
        table += (table.empty() ? "" : ", ") + std::string(key) + " = " + value;
      branch += "  { " + table + " },\n";
    }
    values.emplace_back(field.key, branch + "]");
  }
  return values;
}

}  // namespace

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
      for (const auto& [key, value] : layer_values(layer)) out << key << " = " << value << "\n";
    }
  }
  return out.str();
}

std::vector<LayerSpec> expand_transformer_block(const LayerSpec& block, std::int64_t width) {
  const auto layer = [&block](LayerType type, const char* name, std::int64_t out = 0) {
    LayerSpec spec;
    spec.type = type;
    spec.name = name;
    spec.out = out;
    spec.position = block.position;
    return spec;
  };
  LayerSpec attention = layer(LayerType::attention, "attn");
  attention.heads = block.heads;
  attention.causal = block.causal;
  attention.dropout = block.dropout;
  LayerSpec gelu = layer(LayerType::gelu, "gelu");
  gelu.approximate = GeluApproximation::tanh;
  std::vector<LayerSpec> blocks(2, layer(LayerType::residual, ""));
  for (LayerSpec& residual : blocks) residual.name = block.name;
  blocks[0].layers = {layer(LayerType::layernorm, "ln_1"), attention};
  blocks[1].layers = {layer(LayerType::layernorm, "ln_2"), layer(LayerType::linear, "c_fc", block.mlp_ratio * width),
                      gelu, layer(LayerType::linear, "c_proj", width)};
  // GPT-2's resid_pdrop: a dropout layer ends each branch, only when asked for, so a block without it keeps its layers
  // (and their indices, which key the initialisation) exactly.
  if (block.residual_dropout > 0.0)
    for (std::size_t branch = 0; branch < blocks.size(); ++branch) {
      LayerSpec dropout = layer(LayerType::dropout, branch == 0 ? "resid_dropout_1" : "resid_dropout_2");
      dropout.p = block.residual_dropout;
      blocks[branch].layers.push_back(dropout);
    }
  return blocks;
}

std::vector<std::string> accepted_keys() {
  std::vector<std::string> keys;
  for (const auto& section : schema())
    for (const auto& field : section.fields) keys.push_back(std::string(section.name) + "." + std::string(field.key));
  for (const auto& field : layer_fields()) keys.push_back("model.layers[]." + std::string(field.key));
  return keys;
}

}  // namespace hpctrain
