// The schema's tables.
#include "deck_schema.hpp"

#include <algorithm>

namespace hpctrain::deck {
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
           {"class_weights", Kind::number_array, bind_field<&Config::model, &ModelSection::class_weights>},
           {"label_smoothing", Kind::number, bind_field<&Config::model, &ModelSection::label_smoothing>},
           {"init", Kind::string, bind_field<&Config::model, &ModelSection::init>},
       }},
      {"data",
       {
           {"train", Kind::string_array, bind_field<&Config::data, &DataSection::train>},
           {"validation", Kind::string_array, bind_field<&Config::data, &DataSection::validation>},
           {"features", Kind::string, bind_field<&Config::data, &DataSection::features>},
           {"labels", Kind::string, bind_field<&Config::data, &DataSection::labels>},
           {"targets", Kind::string, bind_field<&Config::data, &DataSection::targets>},
           {"sequence_length", Kind::integer, bind_field<&Config::data, &DataSection::sequence_length>},
           {"batch_size", Kind::integer, bind_field<&Config::data, &DataSection::batch_size>},
           {"eval_batch_size", Kind::integer, bind_field<&Config::data, &DataSection::eval_batch_size>},
           {"shuffle", Kind::shuffle, bind_field<&Config::data, &DataSection::shuffle>},
           {"drop_last", Kind::boolean, bind_field<&Config::data, &DataSection::drop_last>},
           {"prefetch", Kind::integer, bind_field<&Config::data, &DataSection::prefetch>},
           {"in_memory", Kind::boolean, bind_field<&Config::data, &DataSection::in_memory>},
           {"huge_pages", Kind::boolean, bind_field<&Config::data, &DataSection::huge_pages>},
           {"log1p", Kind::boolean, bind_field<&Config::data, &DataSection::log1p>},
           {"scale", Kind::number, bind_field<&Config::data, &DataSection::scale>},
           {"shift", Kind::number, bind_field<&Config::data, &DataSection::shift>},
           {"normalize", Kind::string, bind_field<&Config::data, &DataSection::normalize>},
           {"mean", Kind::number_array, bind_field<&Config::data, &DataSection::mean>},
           {"std", Kind::number_array, bind_field<&Config::data, &DataSection::std>},
           {"augment_flip", Kind::boolean, bind_field<&Config::data, &DataSection::augment_flip>},
           {"augment_crop_padding", Kind::integer, bind_field<&Config::data, &DataSection::augment_crop_padding>},
           {"augment_rot90", Kind::boolean, bind_field<&Config::data, &DataSection::augment_rot90>},
       }},
      {"train",
       {
           {"steps", Kind::integer, bind_field<&Config::train, &TrainSection::steps>},
           {"epochs", Kind::integer, bind_field<&Config::train, &TrainSection::epochs>},
           {"log_every", Kind::integer, bind_field<&Config::train, &TrainSection::log_every>},
           {"eval_every", Kind::integer, bind_field<&Config::train, &TrainSection::eval_every>},
           {"eval_every_epochs", Kind::integer, bind_field<&Config::train, &TrainSection::eval_every_epochs>},
           {"profile", Kind::boolean, bind_field<&Config::train, &TrainSection::profile>},
           {"time_limit", Kind::string, bind_field<&Config::train, &TrainSection::time_limit>},
           {"accumulate", Kind::integer, bind_field<&Config::train, &TrainSection::accumulate>},
           {"early_stopping_patience", Kind::integer,
            bind_field<&Config::train, &TrainSection::early_stopping_patience>},
           {"early_stopping_min_delta", Kind::number,
            bind_field<&Config::train, &TrainSection::early_stopping_min_delta>},
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
           {"tf32", Kind::boolean, bind_field<&Config::precision, &PrecisionSection::tf32>},
       }},
      {"checkpoint",
       {
           {"every_steps", Kind::integer, bind_field<&Config::checkpoint, &CheckpointSection::every_steps>},
           {"every_epochs", Kind::integer, bind_field<&Config::checkpoint, &CheckpointSection::every_epochs>},
           {"every_seconds", Kind::seconds_or_off, bind_field<&Config::checkpoint, &CheckpointSection::every_seconds>},
           {"keep", Kind::integer, bind_field<&Config::checkpoint, &CheckpointSection::keep>},
           {"at_end", Kind::boolean, bind_field<&Config::checkpoint, &CheckpointSection::at_end>},
           {"on_signal", Kind::string_array, bind_field<&Config::checkpoint, &CheckpointSection::on_signal>},
           {"best_metric", Kind::string, bind_field<&Config::checkpoint, &CheckpointSection::best_metric>},
       }},
  };
  return sections;
}

const std::vector<LayerFieldSpec>& layer_fields() {
  using Kind = ValueKind;
  static const std::vector<LayerFieldSpec> fields = {
      {"type", Kind::string, bind_layer_field<&LayerSpec::type>},
      {"name", Kind::string, bind_layer_field<&LayerSpec::name>},
      {"out", Kind::integer, bind_layer_field<&LayerSpec::out>},
      {"in", Kind::integer, bind_layer_field<&LayerSpec::in>},
      {"bias", Kind::boolean, bind_layer_field<&LayerSpec::bias>},
      {"tie", Kind::string, bind_layer_field<&LayerSpec::tie>},
      {"p", Kind::number, bind_layer_field<&LayerSpec::p>},
      {"negative_slope", Kind::number, bind_layer_field<&LayerSpec::negative_slope>},
      {"approximate", Kind::string, bind_layer_field<&LayerSpec::approximate>},
      {"eps", Kind::number, bind_layer_field<&LayerSpec::eps>},
      {"kernel", Kind::extents, bind_layer_field<&LayerSpec::kernel>},
      {"stride", Kind::extents, bind_layer_field<&LayerSpec::stride>},
      {"padding", Kind::extents, bind_layer_field<&LayerSpec::padding>},
      {"dilation", Kind::extents, bind_layer_field<&LayerSpec::dilation>},
      {"groups", Kind::integer, bind_layer_field<&LayerSpec::groups>},
      {"vocabulary", Kind::integer, bind_layer_field<&LayerSpec::vocabulary>},
      {"positions", Kind::boolean, bind_layer_field<&LayerSpec::positions>},
      {"class_token", Kind::boolean, bind_layer_field<&LayerSpec::class_token>},
      {"heads", Kind::integer, bind_layer_field<&LayerSpec::heads>},
      {"causal", Kind::boolean, bind_layer_field<&LayerSpec::causal>},
      {"dropout", Kind::number, bind_layer_field<&LayerSpec::dropout>},
      {"residual_dropout", Kind::number, bind_layer_field<&LayerSpec::residual_dropout>},
      {"layers", Kind::layers, bind_no_layer_field},
      {"mlp_ratio", Kind::integer, bind_layer_field<&LayerSpec::mlp_ratio>},
      {"mode", Kind::string, bind_layer_field<&LayerSpec::mode>},
  };
  return fields;
}

const std::vector<LayerTypeSpec>& layer_types() {
  using enum LayerType;
  static const std::vector<LayerTypeSpec> types = {
      {linear, {"out", "in", "bias", "tie"}},
      {relu, {}},
      {gelu, {"approximate"}},
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
      {embedding, {"vocabulary", "out", "positions"}},
      {attention, {"heads", "causal", "dropout"}},
      {residual, {"layers"}},
      {transformer_block, {"heads", "causal", "mlp_ratio", "dropout", "residual_dropout"}},
      {sequence_pool, {"mode"}},
      {to_sequence, {"positions", "class_token"}},
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

}  // namespace hpctrain::deck
