// How a deck's batches divide over the ranks, how many steps it runs, and whether the data and the model fit it: the
// checks the trainer and the dry run (train --dry-run) share, so both refuse a deck with the same message.
#pragma once

#include <cstdint>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

class Model;

struct BatchShape {
  std::int64_t local_batch = 0;       // samples per rank and step
  std::int64_t micro_rows = 0;        // samples per micro-batch (train.accumulate)
  std::int64_t eval_local_batch = 0;  // samples per rank and evaluation batch
};

// InputError when data.batch_size does not divide over the ranks and train.accumulate.
BatchShape batch_shape(const RunConfig& config, int ranks);

// InputError when one global batch does not fit in the training set or the validation samples have another shape.
void check_data_fits(const RunConfig& config, const TrainingData& train, const TrainingData* validation);

// InputError when token data meets a model that does not start with an embedding (or features meet one that does),
// or a language model's output is not (T, vocabulary) under cross-entropy; when a regression model's outputs do not
// match the target columns, or (collective) a label is out of the model's classes.
void check_model_fits_data(const RunConfig& config, const Model& model, const TrainingData& train,
                           const TrainingData* validation, const MpiEnvironment& mpi);

// train.steps, or train.epochs x steps per epoch (InputError for no step per epoch, or past the 2^31 - 1 steps a run
// can take).
std::int64_t total_steps_of(const RunConfig& config, std::int64_t steps_per_epoch);

}  // namespace hpctrain
