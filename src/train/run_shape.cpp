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

void refuse_token_data(const TrainingData& data, const std::string& where) {
  HPCTRAIN_VERIFY(!data.holds_tokens(), InputError,
                  where << ": '" << data.file() << "' holds token data (" << data.samples() << " windows of "
                        << data.sequence_length() << " tokens, vocabulary " << data.vocabulary()
                        << "), and no layer takes token ids: language models are not supported yet",
                  "the embedding layer lands with issue 16; until then train on /features data ('hpctrain data "
                  "inspect' describes the file)");
}

void check_data_fits(const RunConfig& config, const TrainingData& train, const TrainingData* validation) {
  refuse_token_data(train, config.where("data.train"));
  if (validation) refuse_token_data(*validation, config.where("data.validation"));
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

void check_model_fits_data(const RunConfig& config, const Model& model, const TrainingData& train,
                           const TrainingData* validation, const MpiEnvironment& mpi) {
  const TaskKind task = task_of(config.model.loss);
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
