// Checkpoint files, without knowing what a run stores in them (train/checkpointing.hpp decides that: which vectors,
// under PyTorch's names). A checkpoint is one HDF5 file written by all ranks together through parallel HDF5 (MPI-IO),
// committed atomically in a directory with a `latest` pointer and rotation, and checked by a CRC-32 per dataset.
//
// What is stored: flat float vectors (each rank holds the same values) as named tensors, each a contiguous piece of
// the vector with a shape; scalar datasets; attributes. Every dataset has an attribute crc32 (zlib's CRC-32 of its
// little-endian bytes). Root attributes written here: format, hpctrain_version, world_size, run_id (the run that wrote
// it). Writing: a vector is cut into R contiguous slices and rank r writes slice r (the parts of each tensor it
// overlaps, each one contiguous range of the file: independent I/O; datasets are created collectively). Reading: each
// rank reads its slice in pieces, checksumming each as it comes, then an all-gather assembles the whole vector, so a
// checkpoint loads on any rank count.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/io/crc32.hpp"

namespace hpctrain {

inline constexpr const char* checkpoint_format = "hpctrain-checkpoint-1";

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

// A tensor of a flat vector: the elements [offset, offset + count) stored as dataset `path` of shape `shape`
// (row-major; the product of the extents is count).
struct FlatTensor {
  std::string path;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0, count = 0;
};

// A checkpoint file being written. Every call is collective: all ranks make the same calls, in the same order, with
// the same arguments (the values of the vectors too). Object paths name groups or datasets ("/", "/optimizer").
class CheckpointFileWriter {
 public:
  CheckpointFileWriter(hid_t file, hid_t transfer, const MpiEnvironment& mpi)
      : file_(file), transfer_(transfer), mpi_(mpi) {}
  // Each rank writes its slice of the vector, or with `owned` (ascending, disjoint; the ranks' ranges tile the vector
  // once: a sharded optimizer's state, current on each rank only there) those ranges.
  void write_vector(const std::vector<FlatTensor>& tensors, const float* flat, std::int64_t count,
                    std::optional<std::span<const ElementRange>> owned = std::nullopt);
  void write_int64(const std::string& path, std::int64_t value);
  void write_uint64(const std::string& path, std::uint64_t value);
  void write_float(const std::string& path, float value);
  void write_double(const std::string& path, double value);
  void write_string_attribute(const std::string& object, const std::string& name, const std::string& value);
  void write_integer_attribute(const std::string& object, const std::string& name, std::int64_t value);

 private:
  hid_t file_, transfer_;
  const MpiEnvironment& mpi_;
};

// A checkpoint file open for reading by all ranks; every call is collective. A missing dataset or a failing checksum
// throws CheckpointDamaged, a tensor missing or of another shape CheckpointMismatch (naming it).
class CheckpointFileReader {
 public:
  CheckpointFileReader(hid_t file, std::string path, const MpiEnvironment& mpi)
      : file_(file), path_(std::move(path)), mpi_(mpi) {}
  // Every rank gets the whole vector. With `owned` (ascending, disjoint; the ranks' ranges tile the vector once: a
  // sharded optimizer's state), a rank reads and checksums only those elements, nothing is gathered, and the rest of
  // `flat` keeps what it held; every tensor's checksum is still checked whole, from the ranks' parts.
  void read_vector(const std::vector<FlatTensor>& tensors, float* flat, std::int64_t count,
                   std::optional<std::span<const ElementRange>> owned = std::nullopt);
  [[nodiscard]] std::int64_t read_int64(const std::string& path);
  [[nodiscard]] std::uint64_t read_uint64(const std::string& path);
  [[nodiscard]] float read_float(const std::string& path);
  [[nodiscard]] double read_double(const std::string& path);
  [[nodiscard]] std::string read_string_attribute(const std::string& object, const std::string& name);
  // Whether the file holds `path` (items that older checkpoints lack).
  [[nodiscard]] bool has(const std::string& path) const;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  hid_t file_;  // every read is independent: each rank reads its own slice, or a whole small item
  std::string path_;
  const MpiEnvironment& mpi_;
};

// Opens checkpoint `path` on all ranks, checks its format and runs read(reader) (collective). A file that cannot be
// opened or whose HDF5 structure cannot be read throws CheckpointDamaged naming it, without HDF5's call text.
void read_checkpoint_file(const std::string& path, const MpiEnvironment& mpi,
                          const std::function<void(CheckpointFileReader&)>& read);

// A run's checkpoint directory (OUTPUT/checkpoints): step-NNNNNNNN.h5 files, `latest`, the name of the newest, and
// `best`, the name of the best by the run's validation metric (when it watches one); rotation never removes that one.
class CheckpointDirectory {
 public:
  // keep: newest checkpoints kept (0 = all); run_id: stored in every checkpoint.
  CheckpointDirectory(std::filesystem::path directory, const MpiEnvironment& mpi, std::int64_t keep,
                      std::string run_id = {});

  // Writes and commits the checkpoint of `step` (collective): fill(writer) writes its contents, then rank 0 commits it
  // with `latest` pointing at it (and `best` too when `best`): both flushed, renamed after it, then one flush of the
  // directory (commit_file), and removes the
  // checkpoints beyond `keep`, except the one `best` names. When the write fails on any rank (a full disk), the
  // partial file is removed and every rank throws one Error that says why; the previous checkpoint stays committed.
  // expected_bytes: about how large the file becomes. Returns its path.
  std::string write(std::int64_t step, std::uintmax_t expected_bytes,
                    const std::function<void(CheckpointFileWriter&)>& fill, bool best = false);

  // Checkpoint files, newest first: the one `latest` names, then the others by step.
  [[nodiscard]] std::vector<std::filesystem::path> candidates() const;
  // Removes the checkpoints past `step` (a run continued from an older checkpoint abandons them), and `best` when it
  // named one of them. Rank 0 only; returns how many were removed.
  std::size_t discard_after(std::int64_t step) const;
  [[nodiscard]] const std::filesystem::path& directory() const { return directory_; }

 private:
  std::filesystem::path directory_;
  const MpiEnvironment& mpi_;
  std::int64_t keep_;
  std::string run_id_;
};

// The checkpoint file name a pointer file of a checkpoint directory holds (`latest`, `best`), "" when there is none.
std::string pointed_name(const std::filesystem::path& directory, const std::string& pointer);

// The checkpoints of a directory (OUTPUT/checkpoints), newest first: the one `latest` names, then the others by step.
std::vector<std::filesystem::path> checkpoint_files(const std::filesystem::path& directory);

// The run_id attribute of a checkpoint ("" when it has none or cannot be read). Rank-local.
std::string checkpoint_run_id(const std::string& path);

// A root attribute of a checkpoint, read by one process. Throws InputError if `path` is not an hpctrain checkpoint or
// has no such attribute.
std::string checkpoint_string_attribute(const std::string& path, const std::string& name);
std::int64_t checkpoint_integer_attribute(const std::string& path, const std::string& name);

// What a user may name as a checkpoint: a file, a run directory (its checkpoints/latest), a run's checkpoints/
// directory, or a `latest` or `best` file (the best checkpoint by checkpoint.best_metric). Returns the checkpoint file;
// throws InputError naming the argument when none is found.
std::filesystem::path resolve_checkpoint(const std::string& argument);

// Check a checkpoint file on its own (one process): every dataset present and matching its checksum. Returns an empty
// string when it is sound, else what is wrong.
std::string verify_checkpoint(const std::string& path);

}  // namespace hpctrain
