// Checkpoints: one HDF5 file per checkpoint, written by all ranks together through parallel HDF5 (MPI-IO), committed
// atomically, verified by a CRC-32 per dataset on load. Layout (docs/file-formats.md):
//   /model/<layer>/<param>                    fp32, PyTorch's shapes (linear weight: out x in)
//   /optimizer/<state>/<layer>/<param>        exp_avg, exp_avg_sq (AdamW) or momentum_buffer (SGD); attrs type, step
//   /precision/loss_scale, growth_tracker, consecutive_skips
//   /data/epoch, /data/step_in_epoch          position in the (rank-count independent) global data order
//   /rng/seed                                 all randomness is counter-based: the seed is the whole state
//   /train/step                               optimizer steps completed
//   root attributes: format, hpctrain_version, world_size, deck (the resolved deck text), run_id (the run that wrote
//   it)
// Every dataset has an attribute crc32 (zlib's CRC-32 of its little-endian bytes).
//
// Writing: the flat parameter vector and each optimizer state vector are cut into R contiguous slices; rank r writes
// slice r (the parts of each tensor it overlaps) with collective I/O. Reading: each rank reads its slice, then an
// all-gather assembles the full vectors, so a checkpoint loads on any rank count.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

class Model;
class Optimizer;

inline constexpr const char* checkpoint_format = "hpctrain-checkpoint-1";

// The scalars of a run besides the flat buffers.
struct CheckpointState {
  std::int64_t step = 0;  // optimizer steps completed (the next step to run)
  std::int64_t epoch = 0, step_in_epoch = 0;
  StepScalars scalars;
  std::uint64_t seed = 0;
};

// A checkpoint that cannot be read: missing, truncated, damaged metadata, a failing checksum. An older checkpoint of
// the same run may still do.
class CheckpointDamaged : public InputError {
 public:
  using InputError::InputError;
};

// A sound checkpoint that does not fit the deck (another model or optimizer): no older checkpoint of the run will.
class CheckpointMismatch : public InputError {
 public:
  using InputError::InputError;
};

// CRC-32 (IEEE 802.3, as zlib.crc32), continuing from `crc`.
std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc = 0);

class CheckpointStore {
 public:
  // directory: OUTPUT/checkpoints; keep: newest checkpoints kept (0 = all); run_id: stored in every checkpoint.
  CheckpointStore(std::filesystem::path directory, const MpiEnvironment& mpi, std::int64_t keep,
                  std::string run_id = {});

  // Write and commit a checkpoint of the current state (collective). Returns its final path.
  std::string save(const Model& model, const Optimizer& optimizer, Backend& backend, const CheckpointState& state,
                   const std::string& deck_text);

  // Checkpoint files, newest first: the one `latest` names, then the others by step.
  [[nodiscard]] std::vector<std::filesystem::path> candidates() const;
  // Removes the checkpoints past `step` (a run continued from an older checkpoint abandons them). Rank 0 only;
  // returns how many were removed.
  std::size_t discard_after(std::int64_t step) const;
  [[nodiscard]] const std::filesystem::path& directory() const { return directory_; }

 private:
  std::filesystem::path directory_;
  const MpiEnvironment& mpi_;
  std::int64_t keep_;
  std::string run_id_;
};

// The checkpoints of a directory (OUTPUT/checkpoints), newest first: the one `latest` names, then the others by step.
std::vector<std::filesystem::path> checkpoint_files(const std::filesystem::path& directory);

// Load a checkpoint into the model, the optimizer and state (collective). Throws CheckpointDamaged when the file cannot
// be read (checksum, truncation, damaged metadata) and CheckpointMismatch when it does not match the model (naming the
// first mismatching tensor) or the optimizer.
void load_checkpoint(const std::string& path, Model& model, Optimizer& optimizer, Backend& backend,
                     CheckpointState& state, const MpiEnvironment& mpi);

// Load only the model parameters (inference): no optimizer state is read or kept. Collective.
void load_parameters(const std::string& path, Model& model, Backend& backend, const MpiEnvironment& mpi);
// The resolved deck a checkpoint was written with (its `deck` attribute). Throws InputError if it is not a checkpoint.
std::string checkpoint_deck(const std::string& path);

// The run_id attribute of a checkpoint ("" when it has none or cannot be read). Rank-local.
std::string checkpoint_run_id(const std::string& path);

// What a user may name as a checkpoint: a file, a run directory (its checkpoints/latest), a run's checkpoints/
// directory, or a `latest` file. Returns the checkpoint file; throws InputError naming the argument when none is found.
std::filesystem::path resolve_checkpoint(const std::string& argument);

// Check a checkpoint file on its own (one process): every dataset present and matching its checksum. Returns an empty
// string when it is sound, else what is wrong.
std::string verify_checkpoint(const std::string& path);

}  // namespace hpctrain
