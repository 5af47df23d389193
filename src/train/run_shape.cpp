// The batch, step and fit checks of a deck, shared by the trainer and the dry run.
#include "hpctrain/train/run_shape.hpp"

#include <algorithm>

#include "hpctrain/core/error.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {

BatchShape batch_shape(const RunConfig& config, int ranks) {
  const std::int64_t batch = config.data.batch_size;
  HPCTRAIN_VERIFY(batch % ranks == 0, InputError,
                  config.where("data.batch_size") << ": data.batch_size = " << batch << " is not divisible by the "
                                                  << ranks << " ranks of this run",
                  "data.batch_size is the global batch; pick a multiple of the rank count (e.g. " +
                      std::to_string((batch / ranks + 1) * ranks) + ")");
  BatchShape shape;
  shape.local_batch = batch / ranks;
  const std::int64_t accumulate = config.train.accumulate;
  HPCTRAIN_VERIFY(shape.local_batch % accumulate == 0, InputError,
                  config.where("train.accumulate")
                      << ": train.accumulate = " << accumulate << " does not divide the " << shape.local_batch
                      << " samples per rank (data.batch_size " << batch << " over " << ranks << " ranks)",
                  "data.batch_size must be a multiple of ranks x train.accumulate");
  shape.micro_rows = shape.local_batch / accumulate;
  const std::int64_t eval_batch = config.data.eval_batch_size > 0 ? config.data.eval_batch_size : batch;
  shape.eval_local_batch = std::max<std::int64_t>(1, (eval_batch + ranks - 1) / ranks);
  return shape;
}

void check_data_fits(const RunConfig& config, const TrainingData& train, const TrainingData* validation) {
  const std::int64_t batch = config.data.batch_size;
  HPCTRAIN_VERIFY(train.samples() >= batch, InputError,
                  config.where("data.batch_size") << ": data.batch_size = " << batch << " but '" << train.file()
                                                  << "' holds only " << train.samples() << " samples",
                  "use a smaller batch or more data: one global batch must fit in the training set");
  if (validation)
    HPCTRAIN_VERIFY(validation->sample_shape() == train.sample_shape(), InputError,
                    config.where("data.validation")
                        << ": validation samples in '" << validation->file() << "' have shape "
                        << shape_text(validation->sample_shape()) << " (" << validation->feature_width()
                        << " features), but training samples in '" << train.file() << "' have shape "
                        << shape_text(train.sample_shape()) << " (" << train.feature_width() << " features)",
                    "the model takes one sample shape: give data.validation the shape of data.train ('hpctrain data "
                    "inspect FILE' shows a file's shapes; 'hpctrain data split' carves a validation set out of the "
                    "training file)");
}

namespace {
// Token data goes with a model whose first layer is an embedding and whose output is a sequence of class scores.
void check_model_reads_data(const RunConfig& config, const Model& model, const TrainingData& train) {
  const std::string where = config.where("model.layers");
  if (!train.holds_tokens()) {
    HPCTRAIN_VERIFY(model.token_ids() == nullptr, InputError,
                    where << ": the model's first layer '" << model.layer(0).name() << "' is an embedding, but '"
                          << train.file() << "' holds features, not token ids",
                    "train an embedding model on token data ('hpctrain data convert --text FILE' makes some), or "
                    "start the model with a layer that reads features");
    return;
  }
  HPCTRAIN_VERIFY(model.token_ids() != nullptr, InputError,
                  where << ": '" << train.file() << "' holds token data (" << train.samples() << " windows of "
                        << train.sequence_length() << " tokens, vocabulary " << train.vocabulary()
                        << "), but the model's first layer '" << model.layer(0).name() << "' (" << model.layer(0).type()
                        << ") does not take token ids",
                  "start model.layers with {type = \"embedding\", vocabulary = " + std::to_string(train.vocabulary()) +
                      ", out = 64}");
  const std::int64_t vocabulary = model.parameter_entries().front().shape.front();
  HPCTRAIN_VERIFY(vocabulary >= train.vocabulary(), InputError,
                  where << ": the embedding '" << model.layer(0).name() << "' has vocabulary = " << vocabulary
                        << " but the token ids of '" << train.file() << "' go up to " << train.vocabulary() - 1,
                  "set vocabulary = " + std::to_string(train.vocabulary()));
  HPCTRAIN_VERIFY(config.model.loss == LossKind::cross_entropy && model.positions() == train.sequence_length() &&
                      model.classes() >= train.vocabulary(),
                  InputError,
                  where << ": a language model predicts the next token at every position: its output must be ("
                        << train.sequence_length() << ", " << train.vocabulary()
                        << ") scored by cross_entropy, but it is "
                        << batch_shape_text(model.layer(model.layer_count() - 1).output_shape())
                        << " with model.loss = \"" << word_of(config.model.loss) << "\"",
                  "end the model with a linear layer of out = " + std::to_string(train.vocabulary()) +
                      " (no flatten after the embedding) and use model.loss = \"cross_entropy\"");
}
}  // namespace

void check_model_fits_data(const RunConfig& config, const Model& model, const TrainingData& train,
                           const TrainingData* validation, const MpiEnvironment& mpi) {
  const TaskKind task = task_of(config.model.loss);
  check_model_reads_data(config, model, train);
  if (task == TaskKind::regression) {
    HPCTRAIN_VERIFY(model.output_width() == train.target_width(), InputError,
                    config.where("model.layers")
                        << ": the model has " << model.output_width() << " outputs but the targets '"
                        << config.data.targets << "' have " << train.target_width() << " columns",
                    "make the last linear layer's 'out' equal to the number of target columns");
  }
  const std::int64_t classes = task == TaskKind::classification ? model.output_width() : 0;
  train.validate(mpi, classes);
  if (validation) validation->validate(mpi, classes);
}

std::int64_t total_steps_of(const RunConfig& config, std::int64_t steps_per_epoch) {
  HPCTRAIN_VERIFY(steps_per_epoch > 0, InputError,
                  config.where("data.batch_size")
                      << ": data.batch_size = " << config.data.batch_size << " leaves no full batch per epoch");
  std::int64_t total = config.train.steps;
  if (total == 0) {
    // Steps key the 32-bit random streams (dropout masks): a run counts at most 2^31 - 1 of them.
    constexpr std::int64_t max_steps = 2147483647;
    const bool overflow = __builtin_mul_overflow(config.train.epochs, steps_per_epoch, &total);
    HPCTRAIN_VERIFY(!overflow && total <= max_steps, InputError,
                    config.where("train.epochs")
                        << ": train.epochs = " << config.train.epochs << " x " << steps_per_epoch
                        << " steps per epoch is more than the " << max_steps << " steps a run can take",
                    "use at most " + std::to_string(max_steps / steps_per_epoch) + " epochs");
  }
  return total;
}

}  // namespace hpctrain
