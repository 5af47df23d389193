// A run's state as named checkpoint vectors: the model's parameters and the optimizer's state under PyTorch's names.
#include "hpctrain/train/checkpointing.hpp"

#include "hpctrain/io/checkpoint_phases.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/optim/optimizer.hpp"

namespace hpctrain {

namespace {

// The optimizer state vectors under their PyTorch names.
std::vector<std::string> state_names(const Optimizer& optimizer) {
  if (optimizer.hyper().type == OptimizerType::adamw) return {"exp_avg", "exp_avg_sq"};
  if (optimizer.state(0) != nullptr) return {"momentum_buffer"};
  return {};
}

const char* optimizer_type_name(const Optimizer& optimizer) {
  return optimizer.hyper().type == OptimizerType::adamw ? "adamw" : "sgd";
}

// The optimizer state a rank writes and reads: with a sharded update only the elements it owns (the rest it neither
// reads nor keeps current; the ranks' parts tile the state once), otherwise (nullopt) all of it as usual.
std::optional<std::span<const ElementRange>> owned_state(const Optimizer& optimizer) {
  if (!optimizer.sharded()) return std::nullopt;
  return optimizer.owned();
}

// The model's parameters as tensors of a flat vector, under `prefix` ("/model", "/optimizer/exp_avg").
std::vector<FlatTensor> tensors_of(const Model& model, const std::string& prefix) {
  std::vector<FlatTensor> tensors;
  for (const ParameterEntry& parameter : model.parameter_entries())
    tensors.push_back(
        {prefix + "/" + parameter.layer + "/" + parameter.name, parameter.shape, parameter.offset, parameter.count});
  return tensors;
}

// The run's fp32 vectors in backend memory: the model's master parameters, then the optimizer's state vectors.
std::vector<float*> run_vectors(const Model& model, const Optimizer& optimizer) {
  std::vector<float*> vectors = {static_cast<float*>(model.master())};
  for (std::size_t i = 0; i < state_names(optimizer).size(); ++i)
    vectors.push_back(optimizer.state(static_cast<int>(i)));
  return vectors;
}

// Host memory for a checkpoint to write from or read into: the backend's buffers themselves when its memory is host
// memory (no copy, no allocation), else host buffers of their size (`copies`), which then point at them instead.
std::vector<float*> host_vectors(std::vector<float*> vectors, std::int64_t count, const Backend& backend,
                                 std::vector<std::vector<float>>& copies) {
  if (backend.memory_is_host()) return vectors;
  copies.assign(vectors.size(), std::vector<float>(static_cast<std::size_t>(count)));
  for (std::size_t i = 0; i < vectors.size(); ++i) vectors[i] = copies[i].data();
  return vectors;
}

std::size_t bytes_of(std::int64_t count) { return static_cast<std::size_t>(count) * sizeof(float); }

}  // namespace

CheckpointStore::CheckpointStore(std::filesystem::path directory, const MpiEnvironment& mpi, std::int64_t keep,
                                 std::string run_id)
    : files_(std::move(directory), mpi, keep, std::move(run_id)), mpi_(mpi) {}

std::string CheckpointStore::save(const Model& model, const Optimizer& optimizer, Backend& backend,
                                  const CheckpointState& state, const std::string& deck_text, bool best) {
  checkpoint_phases_start();
  const std::int64_t count = model.parameter_count();
  const auto names = state_names(optimizer);
  const std::vector<float*> in_backend = run_vectors(model, optimizer);
  std::vector<std::vector<float>> copies;
  const std::vector<float*> vectors = host_vectors(in_backend, count, backend, copies);
  if (!copies.empty()) {
    const CheckpointPhaseScope phase(CheckpointPhase::copy);
    for (std::size_t i = 0; i < vectors.size(); ++i) backend.copy_to_host(vectors[i], in_backend[i], bytes_of(count));
  }
  // The vectors plus the small items and the deck: what the file system must find room for.
  const std::uintmax_t expected_bytes =
      (1 + names.size()) * static_cast<std::uintmax_t>(count) * sizeof(float) + deck_text.size() + (64 << 10);
  const std::string path = files_.write(
      state.step, expected_bytes,
      [&](CheckpointFileWriter& file) {
        file.write_vector(tensors_of(model, "/model"), vectors[0], count);
        for (std::size_t i = 0; i < names.size(); ++i)
          file.write_vector(tensors_of(model, "/optimizer/" + names[i]), vectors[i + 1], count, owned_state(optimizer));
        file.write_int64("/optimizer/step", state.scalars.applied_steps);
        file.write_float("/precision/loss_scale", state.scalars.loss_scale);
        file.write_int64("/precision/growth_tracker", state.scalars.growth_tracker);
        file.write_int64("/precision/consecutive_skips", state.scalars.consecutive_skips);
        file.write_int64("/data/epoch", state.epoch);
        file.write_int64("/data/step_in_epoch", state.step_in_epoch);
        file.write_uint64("/rng/seed", state.seed);
        file.write_int64("/train/step", state.step);
        file.write_int64("/schedule/origin", state.schedule_origin);
        file.write_int64("/schedule/total_steps", state.schedule_total_steps);
        if (state.watches_best) {  // only then: other runs' checkpoints keep their layout
          file.write_int64("/train/best_step", state.best.step);
          file.write_double("/train/best_value", state.best.value);
          file.write_int64("/train/evaluations_without_improvement", state.best.stale_evaluations);
          file.write_string_attribute("/train", "best_metric", std::string(word_of(state.best_metric)));
        }
        file.write_string_attribute("/optimizer", "type", optimizer_type_name(optimizer));
        file.write_integer_attribute("/", "input_features", model.input_width());
        file.write_string_attribute("/", "deck", deck_text);
      },
      best);
  checkpoint_phases_report("write", mpi_.is_root());
  return path;
}

void load_checkpoint(const std::string& path, Model& model, Optimizer& optimizer, Backend& backend,
                     CheckpointState& state, const MpiEnvironment& mpi) {
  checkpoint_phases_start();
  const std::int64_t count = model.parameter_count();
  const auto names = state_names(optimizer);
  // Read in place when backend memory is host memory: a failed read leaves the buffers overwritten, which is fine, as
  // the run then loads an older checkpoint or ends.
  const std::vector<float*> in_backend = run_vectors(model, optimizer);
  std::vector<std::vector<float>> copies;
  const std::vector<float*> vectors = host_vectors(in_backend, count, backend, copies);
  read_checkpoint_file(path, mpi, [&](CheckpointFileReader& file) {
    file.read_vector(tensors_of(model, "/model"), vectors[0], count);
    const std::string stored_type = file.read_string_attribute("/optimizer", "type");
    const std::string wanted_type = optimizer_type_name(optimizer);
    HPCTRAIN_VERIFY(
        stored_type == wanted_type, CheckpointMismatch,
        "checkpoint '" << path << "' holds " << stored_type << " state but the deck asks for " << wanted_type,
        "resume with the optimizer the checkpoint was written with");
    for (std::size_t i = 0; i < names.size(); ++i)
      file.read_vector(tensors_of(model, "/optimizer/" + names[i]), vectors[i + 1], count, owned_state(optimizer));
    state.scalars = StepScalars{};
    state.scalars.applied_steps = static_cast<std::int32_t>(file.read_int64("/optimizer/step"));
    state.scalars.loss_scale = file.read_float("/precision/loss_scale");
    state.scalars.growth_tracker = static_cast<std::int32_t>(file.read_int64("/precision/growth_tracker"));
    state.scalars.consecutive_skips = static_cast<std::int32_t>(file.read_int64("/precision/consecutive_skips"));
    state.epoch = file.read_int64("/data/epoch");
    state.step_in_epoch = file.read_int64("/data/step_in_epoch");
    state.seed = file.read_uint64("/rng/seed");
    state.step = file.read_int64("/train/step");
    state.schedule_origin = file.has("/schedule/origin") ? file.read_int64("/schedule/origin") : 0;
    state.schedule_total_steps = file.has("/schedule/total_steps") ? file.read_int64("/schedule/total_steps") : -1;
    state.watches_best = file.has("/train/best_step");
    state.best = BestState{};
    if (state.watches_best) {
      state.best.step = file.read_int64("/train/best_step");
      state.best.value = file.read_double("/train/best_value");
      state.best.stale_evaluations = file.read_int64("/train/evaluations_without_improvement");
      state.best_metric =
          choice_named<BestMetric>(file.read_string_attribute("/train", "best_metric")).value_or(BestMetric::none);
    }
  });
  {
    const CheckpointPhaseScope phase(CheckpointPhase::copy);
    for (std::size_t i = 0; i < copies.size(); ++i) backend.copy_to_backend(in_backend[i], vectors[i], bytes_of(count));
    model.refresh_working_copy();
  }
  checkpoint_phases_report("read", mpi.is_root());
}

void load_parameters(const std::string& path, Model& model, Backend& backend, const MpiEnvironment& mpi) {
  const std::int64_t count = model.parameter_count();
  float* const in_backend = static_cast<float*>(model.master());
  std::vector<std::vector<float>> copies;
  float* const parameters = host_vectors({in_backend}, count, backend, copies)[0];
  read_checkpoint_file(
      path, mpi, [&](CheckpointFileReader& file) { file.read_vector(tensors_of(model, "/model"), parameters, count); });
  if (!copies.empty()) backend.copy_to_backend(in_backend, parameters, bytes_of(count));
  model.refresh_working_copy();
}

std::string checkpoint_deck(const std::string& path) { return checkpoint_string_attribute(path, "deck"); }

std::int64_t checkpoint_input_features(const std::string& path) {
  return checkpoint_integer_attribute(path, "input_features");
}

}  // namespace hpctrain
