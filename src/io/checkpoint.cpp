// Parallel HDF5 checkpoints: slices written collectively, atomic commit, checksummed load with resharding.
#include "hpctrain/io/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/optim/optimizer.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc) {
  // zlib's CRC-32 (the one Python's zlib.crc32 computes), in pieces its 32-bit length argument can take.
  const auto* byte = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const auto piece = static_cast<uInt>(std::min<std::size_t>(bytes, 1u << 30));
    crc = static_cast<std::uint32_t>(::crc32(crc, byte, piece));
    byte += piece;
    bytes -= piece;
  }
  return crc;
}

namespace {

// A tensor of the checkpoint: a dataset path, its shape, and where its elements live in a flat host vector.
struct TensorEntry {
  std::string path;
  std::vector<hsize_t> shape;
  std::int64_t offset = 0, count = 0;
};

// The optimizer state vectors under their PyTorch names.
std::vector<std::string> state_names(const Optimizer& optimizer) {
  if (optimizer.hyper().type == OptimizerType::adamw) return {"exp_avg", "exp_avg_sq"};
  if (optimizer.state(0) != nullptr) return {"momentum_buffer"};
  return {};
}

std::vector<TensorEntry> tensor_entries(const Model& model, const std::string& prefix) {
  std::vector<TensorEntry> entries;
  for (const ParameterEntry& parameter : model.parameter_entries()) {
    TensorEntry entry{prefix + "/" + parameter.layer + "/" + parameter.name, {}, parameter.offset, parameter.count};
    for (auto extent : parameter.shape) entry.shape.push_back(static_cast<hsize_t>(extent));
    entries.push_back(std::move(entry));
  }
  return entries;
}

// This rank's contiguous part [begin, end) of a flat vector of `count` elements.
std::pair<std::int64_t, std::int64_t> rank_slice(std::int64_t count, int rank, int ranks) {
  const std::int64_t per_rank = (count + ranks - 1) / ranks;
  const std::int64_t begin = std::min<std::int64_t>(per_rank * rank, count);
  return {begin, std::min<std::int64_t>(begin + per_rank, count)};
}

// Add the row-major flat range [first, last) of the trailing dimensions dims[depth:] (leading coordinates fixed by
// prefix) to a selection, as at most three hyperslabs per level: a partial first row, whole rows, a partial last row.
void select_flat_range(hid_t space, const std::vector<hsize_t>& dims, std::size_t depth, std::vector<hsize_t>& prefix,
                       hsize_t first, hsize_t last) {
  if (first >= last) return;
  const std::size_t rank = dims.size();
  auto add_block = [&](hsize_t row_begin, hsize_t rows, std::size_t level, hsize_t inner_begin, hsize_t inner_count) {
    std::vector<hsize_t> start(prefix), count(prefix.size(), 1);
    start.push_back(row_begin);
    count.push_back(rows);
    for (std::size_t d = level + 1; d < rank; ++d) {
      start.push_back(d == rank - 1 ? inner_begin : 0);
      count.push_back(d == rank - 1 ? inner_count : dims[d]);
    }
    HPCTRAIN_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
  };
  if (depth == rank - 1) {
    add_block(first, last - first, depth, 0, 0);
    return;
  }
  hsize_t inner = 1;
  for (std::size_t d = depth + 1; d < rank; ++d) inner *= dims[d];
  hsize_t row_first = first / inner;
  const hsize_t row_last = last / inner;
  if (row_first == row_last) {
    prefix.push_back(row_first);
    select_flat_range(space, dims, depth + 1, prefix, first % inner, last % inner);
    prefix.pop_back();
    return;
  }
  if (first % inner != 0) {
    prefix.push_back(row_first);
    select_flat_range(space, dims, depth + 1, prefix, first % inner, inner);
    prefix.pop_back();
    ++row_first;
  }
  if (row_last > row_first) {  // whole rows: every trailing dimension in full
    std::vector<hsize_t> start(prefix), count(prefix.size(), 1);
    start.push_back(row_first);
    count.push_back(row_last - row_first);
    for (std::size_t d = depth + 1; d < rank; ++d) {
      start.push_back(0);
      count.push_back(dims[d]);
    }
    HPCTRAIN_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
  }
  if (last % inner != 0) {
    prefix.push_back(row_last);
    select_flat_range(space, dims, depth + 1, prefix, 0, last % inner);
    prefix.pop_back();
  }
}

// The part of a tensor inside [slice_begin, slice_end) of the flat vector, in the tensor's own flat coordinates.
std::pair<hsize_t, hsize_t> overlap(const TensorEntry& tensor, std::int64_t slice_begin, std::int64_t slice_end) {
  const std::int64_t begin = std::max(tensor.offset, slice_begin);
  const std::int64_t end = std::min(tensor.offset + tensor.count, slice_end);
  if (begin >= end) return {0, 0};
  return {static_cast<hsize_t>(begin - tensor.offset), static_cast<hsize_t>(end - tensor.offset)};
}

// The part of a tensor in this rank's slice, as a file selection on the dataset and a 1-D memory selection (both
// empty when the slice misses the tensor: the collective call is still made).
struct SliceSelection {
  H5Handle file, memory;
  hsize_t first = 0;  // first element, in the tensor's flat coordinates
};

SliceSelection select_slice(hid_t dataset, const TensorEntry& tensor, std::int64_t slice_begin,
                            std::int64_t slice_end) {
  const auto [first, last] = overlap(tensor, slice_begin, slice_end);
  SliceSelection slice{H5Handle(HPCTRAIN_H5_CHECK(H5Dget_space(dataset))), {}, first};
  HPCTRAIN_H5_CHECK(H5Sselect_none(slice.file.get()));
  std::vector<hsize_t> prefix;
  select_flat_range(slice.file.get(), tensor.shape, 0, prefix, first, last);
  const hsize_t elements = std::max<hsize_t>(last - first, 1);
  slice.memory = H5Handle(HPCTRAIN_H5_CHECK(H5Screate_simple(1, &elements, nullptr)));
  if (last == first) HPCTRAIN_H5_CHECK(H5Sselect_none(slice.memory.get()));
  return slice;
}

H5Handle parallel_access(const MpiEnvironment& mpi) {
  H5Handle access(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  HPCTRAIN_H5_CHECK(H5Pset_fapl_mpio(access.get(), mpi.world(), MPI_INFO_NULL));
  HPCTRAIN_H5_CHECK(H5Pset_all_coll_metadata_ops(access.get(), true));
  HPCTRAIN_H5_CHECK(H5Pset_coll_metadata_write(access.get(), true));
  HPCTRAIN_H5_CHECK(H5Pset_file_locking(access.get(), false, true));
  return access;
}

H5Handle collective_transfer() {
  H5Handle transfer(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  HPCTRAIN_H5_CHECK(H5Pset_dxpl_mpio(transfer.get(), H5FD_MPIO_COLLECTIVE));
  return transfer;
}

H5Handle create_dataset(hid_t file, const std::string& path, hid_t type, const std::vector<hsize_t>& shape) {
  H5Handle link_creation(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  HPCTRAIN_H5_CHECK(H5Pset_create_intermediate_group(link_creation.get(), 1));
  H5Handle space(shape.empty()
                     ? HPCTRAIN_H5_CHECK(H5Screate(H5S_SCALAR))
                     : HPCTRAIN_H5_CHECK(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr)));
  return H5Handle(HPCTRAIN_H5_CHECK(
      H5Dcreate2(file, path.c_str(), type, space.get(), link_creation.get(), H5P_DEFAULT, H5P_DEFAULT)));
}

void write_crc(hid_t dataset, std::uint32_t crc) {
  H5Handle space(HPCTRAIN_H5_CHECK(H5Screate(H5S_SCALAR)));
  H5Handle attribute(
      HPCTRAIN_H5_CHECK(H5Acreate2(dataset, "crc32", H5T_STD_U32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  HPCTRAIN_H5_CHECK(H5Awrite(attribute.get(), H5T_NATIVE_UINT32, &crc));
}

std::uint32_t read_crc(hid_t dataset, const std::string& path, const std::string& file) {
  HPCTRAIN_VERIFY(H5Aexists(dataset, "crc32") > 0, CheckpointDamaged,
                  "checkpoint '" << file << "' is damaged: dataset " << path << " has no crc32 attribute");
  H5Handle attribute(HPCTRAIN_H5_CHECK(H5Aopen(dataset, "crc32", H5P_DEFAULT)));
  std::uint32_t crc = 0;
  HPCTRAIN_H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_UINT32, &crc));
  return crc;
}

// The CRC-32 of every whole tensor, computed in parallel: each rank checksums the part of each tensor inside its own
// slice, the parts are gathered, and zlib's crc32_combine joins them in order. All ranks get the same values.
std::vector<std::uint32_t> tensor_checksums(const std::vector<TensorEntry>& tensors, const float* flat,
                                            std::int64_t count, const MpiEnvironment& mpi) {
  const auto [slice_begin, slice_end] = rank_slice(count, mpi.rank(), mpi.size());
  std::vector<std::uint64_t> mine(2 * tensors.size());  // per tensor: crc, bytes
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto [first, last] = overlap(tensors[t], slice_begin, slice_end);
    const std::size_t bytes = static_cast<std::size_t>(last - first) * sizeof(float);
    mine[2 * t] = crc32(flat + tensors[t].offset + static_cast<std::int64_t>(first), bytes);
    mine[2 * t + 1] = bytes;
  }
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(mpi.size()));
  HPCTRAIN_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, all.data(),
                                   static_cast<int>(mine.size()), MPI_UINT64_T, mpi.world()));
  std::vector<std::uint32_t> checksums(tensors.size(), 0);
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (int r = 0; r < mpi.size(); ++r) {
      const std::size_t base = static_cast<std::size_t>(r) * mine.size() + 2 * t;
      if (all[base + 1] > 0)
        checksums[t] = static_cast<std::uint32_t>(
            crc32_combine(checksums[t], static_cast<uLong>(all[base]), static_cast<z_off_t>(all[base + 1])));
    }
  return checksums;
}

// Write this rank's slice of each tensor of a flat vector (collective: every rank calls for every tensor).
void write_tensors(hid_t file, const std::vector<TensorEntry>& tensors, const float* flat, std::int64_t count,
                   const MpiEnvironment& mpi, hid_t transfer) {
  const auto [slice_begin, slice_end] = rank_slice(count, mpi.rank(), mpi.size());
  const std::vector<std::uint32_t> checksums = tensor_checksums(tensors, flat, count, mpi);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TensorEntry& tensor = tensors[t];
    H5Handle dataset = create_dataset(file, tensor.path, H5T_IEEE_F32LE, tensor.shape);
    const SliceSelection slice = select_slice(dataset.get(), tensor, slice_begin, slice_end);
    HPCTRAIN_H5_CHECK(H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, slice.memory.get(), slice.file.get(), transfer,
                               flat + tensor.offset + static_cast<std::int64_t>(slice.first)));
    write_crc(dataset.get(), checksums[t]);  // the same value on every rank, as a collective attribute needs
  }
}

// Read this rank's slice of each tensor into flat (collective), then gather the slices: afterwards every rank holds
// the whole vector. Checksums are checked on the assembled tensors.
void read_tensors(hid_t file, const std::string& file_name, const std::vector<TensorEntry>& tensors, float* flat,
                  std::int64_t count, const MpiEnvironment& mpi, hid_t transfer) {
  const auto [slice_begin, slice_end] = rank_slice(count, mpi.rank(), mpi.size());
  for (const TensorEntry& tensor : tensors) {
    HPCTRAIN_VERIFY(
        link_exists(file, tensor.path), CheckpointMismatch,
        "checkpoint '" << file_name << "' has no tensor " << tensor.path << ": it was written for a different model",
        "resume with the deck the checkpoint was written with (stored in its 'deck' attribute)");
    H5Handle dataset(HPCTRAIN_H5_CHECK(H5Dopen2(file, tensor.path.c_str(), H5P_DEFAULT)));
    H5Handle file_space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset.get())));
    const auto shape = dataspace_shape(file_space.get());
    std::vector<std::int64_t> expected(tensor.shape.begin(), tensor.shape.end());
    HPCTRAIN_VERIFY(shape == expected, CheckpointMismatch,
                    "checkpoint '" << file_name << "': tensor " << tensor.path << " has shape " << shape_text(shape)
                                   << " but the deck's model needs " << shape_text(expected),
                    "resume with the deck the checkpoint was written with (stored in its 'deck' attribute)");
    const SliceSelection slice = select_slice(dataset.get(), tensor, slice_begin, slice_end);
    HPCTRAIN_H5_CHECK(H5Dread(dataset.get(), H5T_NATIVE_FLOAT, slice.memory.get(), slice.file.get(), transfer,
                              flat + tensor.offset + static_cast<std::int64_t>(slice.first)));
  }
  // Checksums of the whole tensors from the slices just read, before they are assembled.
  const std::vector<std::uint32_t> checksums = tensor_checksums(tensors, flat, count, mpi);
  // Assemble: rank r contributed [slice_begin_r, slice_end_r).
  std::vector<int> counts(static_cast<std::size_t>(mpi.size())), displacements(counts.size());
  for (int r = 0; r < mpi.size(); ++r) {
    const auto [begin, end] = rank_slice(count, r, mpi.size());
    counts[static_cast<std::size_t>(r)] = static_cast<int>(end - begin);
    displacements[static_cast<std::size_t>(r)] = static_cast<int>(begin);
  }
  HPCTRAIN_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, flat, counts.data(), displacements.data(),
                                    MPI_FLOAT, mpi.world()));
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TensorEntry& tensor = tensors[t];
    H5Handle dataset(HPCTRAIN_H5_CHECK(H5Dopen2(file, tensor.path.c_str(), H5P_DEFAULT)));
    const std::uint32_t stored = read_crc(dataset.get(), tensor.path, file_name);
    HPCTRAIN_VERIFY(stored == checksums[t], CheckpointDamaged,
                    "checkpoint '" << file_name << "' is damaged: tensor " << tensor.path << " fails its checksum");
  }
}

// Small items: scalar datasets written by rank 0 inside a collective call.
template <class T>
void write_scalar(hid_t file, const std::string& path, hid_t file_type, hid_t memory_type, T value,
                  const MpiEnvironment& mpi, hid_t transfer) {
  H5Handle dataset = create_dataset(file, path, file_type, {});
  H5Handle space(HPCTRAIN_H5_CHECK(H5Screate(H5S_SCALAR)));
  if (!mpi.is_root()) HPCTRAIN_H5_CHECK(H5Sselect_none(space.get()));
  HPCTRAIN_H5_CHECK(H5Dwrite(dataset.get(), memory_type, space.get(), space.get(), transfer, &value));
  write_crc(dataset.get(), crc32(&value, sizeof value));
}

template <class T>
T read_scalar(hid_t file, const std::string& path, hid_t memory_type, const std::string& file_name) {
  HPCTRAIN_VERIFY(link_exists(file, path), CheckpointDamaged,
                  "checkpoint '" << file_name << "' is damaged: it has no " << path);
  H5Handle dataset(HPCTRAIN_H5_CHECK(H5Dopen2(file, path.c_str(), H5P_DEFAULT)));
  T value{};
  HPCTRAIN_H5_CHECK(H5Dread(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value));
  HPCTRAIN_VERIFY(read_crc(dataset.get(), path, file_name) == crc32(&value, sizeof value), CheckpointDamaged,
                  "checkpoint '" << file_name << "' is damaged: " << path << " fails its checksum");
  return value;
}

void fsync_path(const fs::path& path, bool directory) {
  const int descriptor = open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  HPCTRAIN_VERIFY(descriptor >= 0, Error, "cannot open '" << path.string() << "' to flush it to disk");
  const int status = fsync(descriptor);
  close(descriptor);
  HPCTRAIN_VERIFY(status == 0, Error, "fsync of '" << path.string() << "' failed");
}

std::string step_file_name(std::int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08lld.h5", static_cast<long long>(step));
  return name;
}

// The step of a checkpoint file name, or -1.
std::int64_t step_of(const fs::path& path) {
  static const std::regex pattern(R"(step-(\d+)\.h5)");
  std::smatch match;
  const std::string name = path.filename().string();
  return std::regex_match(name, match, pattern) ? std::stoll(match[1]) : -1;
}

}  // namespace

CheckpointStore::CheckpointStore(fs::path directory, const MpiEnvironment& mpi, std::int64_t keep, std::string run_id)
    : directory_(std::move(directory)), mpi_(mpi), keep_(keep), run_id_(std::move(run_id)) {}

std::vector<fs::path> checkpoint_files(const fs::path& directory) {
  std::vector<fs::path> files;
  std::error_code error;
  if (!fs::is_directory(directory, error)) return files;
  std::vector<std::pair<std::int64_t, fs::path>> by_step;
  for (const auto& item : fs::directory_iterator(directory, error))
    if (const std::int64_t step = step_of(item.path()); step >= 0) by_step.emplace_back(step, item.path());
  std::sort(by_step.begin(), by_step.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::ifstream latest(directory / "latest");
  std::string named;
  if (latest >> named && fs::exists(directory / named)) files.push_back(directory / named);
  for (auto& [step, path] : by_step)
    if (files.empty() || path != files.front()) files.push_back(path);
  return files;
}

std::vector<fs::path> CheckpointStore::candidates() const { return checkpoint_files(directory_); }

std::size_t CheckpointStore::discard_after(std::int64_t step) const {
  std::size_t removed = 0;
  std::error_code error;
  for (const fs::path& file : candidates())
    if (step_of(file) > step && fs::remove(file, error)) ++removed;
  return removed;
}

std::string CheckpointStore::save(const Model& model, const Optimizer& optimizer, Backend& backend,
                                  const CheckpointState& state, const std::string& deck_text) {
  const fs::path final_path = directory_ / step_file_name(state.step);
  const fs::path partial_path = fs::path(final_path.string() + ".partial");
  run_on_root(mpi_, [&] {
    std::error_code error;
    fs::create_directories(directory_, error);
    if (error)
      throw Error("cannot create checkpoint directory '" + directory_.string() + "': " + error.message(),
                  ErrorScope::this_rank, "check the output directory's file system (space, permissions)");
    for (const auto& item : fs::directory_iterator(directory_, error))  // leftovers of an interrupted write
      if (item.path().extension() == ".partial") fs::remove(item.path(), error);
  });

  // Host copies of the flat buffers (every rank holds the same values).
  const std::int64_t count = model.parameter_count();
  std::vector<float> parameters(static_cast<std::size_t>(count));
  backend.copy_to_host(parameters.data(), model.master(), parameters.size() * sizeof(float));
  const auto names = state_names(optimizer);
  std::vector<std::vector<float>> states;
  for (std::size_t i = 0; i < names.size(); ++i) {
    states.emplace_back(static_cast<std::size_t>(count));
    backend.copy_to_host(states.back().data(), optimizer.state(static_cast<int>(i)),
                         states.back().size() * sizeof(float));
  }

  try {
    const auto lock = lock_hdf5();
    H5Handle access = parallel_access(mpi_);
    H5Handle file(HPCTRAIN_H5_CHECK(H5Fcreate(partial_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get())));
    H5Handle transfer = collective_transfer();
    write_tensors(file.get(), tensor_entries(model, "/model"), parameters.data(), count, mpi_, transfer.get());
    for (std::size_t i = 0; i < names.size(); ++i)
      write_tensors(file.get(), tensor_entries(model, "/optimizer/" + names[i]), states[i].data(), count, mpi_,
                    transfer.get());
    const hid_t f = file.get(), t = transfer.get();
    write_scalar<std::int64_t>(f, "/optimizer/step", H5T_STD_I64LE, H5T_NATIVE_INT64, state.scalars.applied_steps, mpi_,
                               t);
    write_scalar<float>(f, "/precision/loss_scale", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, state.scalars.loss_scale, mpi_,
                        t);
    write_scalar<std::int64_t>(f, "/precision/growth_tracker", H5T_STD_I64LE, H5T_NATIVE_INT64,
                               state.scalars.growth_tracker, mpi_, t);
    write_scalar<std::int64_t>(f, "/precision/consecutive_skips", H5T_STD_I64LE, H5T_NATIVE_INT64,
                               state.scalars.consecutive_skips, mpi_, t);
    write_scalar<std::int64_t>(f, "/data/epoch", H5T_STD_I64LE, H5T_NATIVE_INT64, state.epoch, mpi_, t);
    write_scalar<std::int64_t>(f, "/data/step_in_epoch", H5T_STD_I64LE, H5T_NATIVE_INT64, state.step_in_epoch, mpi_, t);
    write_scalar<std::uint64_t>(f, "/rng/seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, state.seed, mpi_, t);
    write_scalar<std::int64_t>(f, "/train/step", H5T_STD_I64LE, H5T_NATIVE_INT64, state.step, mpi_, t);
    H5Handle optimizer_group(HPCTRAIN_H5_CHECK(H5Gopen2(f, "/optimizer", H5P_DEFAULT)));
    write_string_attribute(optimizer_group.get(), "type",
                           optimizer.hyper().type == OptimizerType::adamw ? "adamw" : "sgd");
    write_string_attribute(f, "format", checkpoint_format);
    write_string_attribute(f, "hpctrain_version", HPCTRAIN_VERSION);
    write_integer_attribute(f, "world_size", mpi_.size());
    write_integer_attribute(f, "input_features", model.input_width());
    write_string_attribute(f, "deck", deck_text);
    if (!run_id_.empty()) write_string_attribute(f, "run_id", run_id_);
    optimizer_group.close();
    file.close();
  } catch (const LibraryError& error) {
    throw Error("writing checkpoint '" + partial_path.string() +
                    "' failed (the file system may be full or over quota); " +
                    "the previous checkpoint is intact. Detail: " + error.what(),
                ErrorScope::this_rank, "free space in " + directory_.string() + " and resume with --resume auto");
  }
  HPCTRAIN_MPI_CHECK(MPI_Barrier(mpi_.world()));

  // Commit on rank 0: data on disk, then the final name, then `latest`; a reader never sees a partial file under a
  // final name, and `latest` always names a complete checkpoint.
  run_on_root(mpi_, [&] {
    fsync_path(partial_path, false);
    fs::rename(partial_path, final_path);
    fsync_path(directory_, true);
    const fs::path latest_temp = directory_ / "latest.tmp";
    {
      std::ofstream latest(latest_temp, std::ios::trunc);
      latest << final_path.filename().string() << "\n";
      latest.flush();
      HPCTRAIN_VERIFY(latest.good(), Error, "cannot write '" << latest_temp.string() << "'");
    }
    fsync_path(latest_temp, false);
    fs::rename(latest_temp, directory_ / "latest");
    fsync_path(directory_, true);
    // Only now remove old checkpoints beyond `keep`.
    if (keep_ > 0) {
      const auto files = candidates();
      std::error_code error;
      for (std::size_t i = static_cast<std::size_t>(keep_); i < files.size(); ++i) fs::remove(files[i], error);
    }
  });
  return final_path.string();
}

namespace {

// Opens a checkpoint for a collective read and checks its format. Caller holds lock_hdf5().
H5Handle open_checkpoint(const std::string& path, const MpiEnvironment& mpi) {
  silence_hdf5_error_printing();
  require_regular_file(path, "checkpoint");
  H5Handle access = parallel_access(mpi);
  const hid_t opened = H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get());
  HPCTRAIN_VERIFY(opened >= 0, CheckpointDamaged,
                  "checkpoint '" << path << "' cannot be opened: missing, truncated or not an HDF5 file");
  H5Handle file(opened);
  HPCTRAIN_VERIFY(
      attribute_exists(file.get(), "format") && read_string_attribute(file.get(), "format") == checkpoint_format,
      CheckpointDamaged, "'" << path << "' is not an hpctrain checkpoint (" << checkpoint_format << ")");
  return file;
}

// Runs a read of checkpoint `path`; a failing HDF5 call inside it (damaged metadata, a truncated file) becomes
// CheckpointDamaged naming the file and what HDF5 found, without HDF5's call text.
template <class Read>
void read_or_damaged(const std::string& path, Read&& read) {
  try {
    read();
  } catch (const LibraryError& error) {
    throw CheckpointDamaged("checkpoint '" + path + "' is damaged: its HDF5 structure cannot be read (" +
                                (error.detail().empty() ? std::string("no detail") : error.detail()) + ")",
                            "'hpctrain checkpoint verify " + path + "' checks it; resume from an older checkpoint");
  }
}

}  // namespace

void load_checkpoint(const std::string& path, Model& model, Optimizer& optimizer, Backend& backend,
                     CheckpointState& state, const MpiEnvironment& mpi) {
  const std::int64_t count = model.parameter_count();
  std::vector<float> parameters(static_cast<std::size_t>(count));
  const auto names = state_names(optimizer);
  std::vector<std::vector<float>> states(names.size(), std::vector<float>(static_cast<std::size_t>(count)));
  read_or_damaged(path, [&] {
    const auto lock = lock_hdf5();
    H5Handle file = open_checkpoint(path, mpi);
    H5Handle transfer = collective_transfer();
    read_tensors(file.get(), path, tensor_entries(model, "/model"), parameters.data(), count, mpi, transfer.get());
    H5Handle optimizer_group(HPCTRAIN_H5_CHECK(H5Gopen2(file.get(), "/optimizer", H5P_DEFAULT)));
    const std::string stored_type = read_string_attribute(optimizer_group.get(), "type");
    const std::string wanted_type = optimizer.hyper().type == OptimizerType::adamw ? "adamw" : "sgd";
    HPCTRAIN_VERIFY(
        stored_type == wanted_type, CheckpointMismatch,
        "checkpoint '" << path << "' holds " << stored_type << " state but the deck asks for " << wanted_type,
        "resume with the optimizer the checkpoint was written with");
    for (std::size_t i = 0; i < names.size(); ++i)
      read_tensors(file.get(), path, tensor_entries(model, "/optimizer/" + names[i]), states[i].data(), count, mpi,
                   transfer.get());
    const hid_t f = file.get();
    state.scalars = StepScalars{};
    state.scalars.applied_steps =
        static_cast<std::int32_t>(read_scalar<std::int64_t>(f, "/optimizer/step", H5T_NATIVE_INT64, path));
    state.scalars.loss_scale = read_scalar<float>(f, "/precision/loss_scale", H5T_NATIVE_FLOAT, path);
    state.scalars.growth_tracker =
        static_cast<std::int32_t>(read_scalar<std::int64_t>(f, "/precision/growth_tracker", H5T_NATIVE_INT64, path));
    state.scalars.consecutive_skips =
        static_cast<std::int32_t>(read_scalar<std::int64_t>(f, "/precision/consecutive_skips", H5T_NATIVE_INT64, path));
    state.epoch = read_scalar<std::int64_t>(f, "/data/epoch", H5T_NATIVE_INT64, path);
    state.step_in_epoch = read_scalar<std::int64_t>(f, "/data/step_in_epoch", H5T_NATIVE_INT64, path);
    state.seed = read_scalar<std::uint64_t>(f, "/rng/seed", H5T_NATIVE_UINT64, path);
    state.step = read_scalar<std::int64_t>(f, "/train/step", H5T_NATIVE_INT64, path);
  });
  backend.copy_to_backend(model.master(), parameters.data(), parameters.size() * sizeof(float));
  model.refresh_working_copy();
  for (std::size_t i = 0; i < names.size(); ++i)
    backend.copy_to_backend(optimizer.state(static_cast<int>(i)), states[i].data(), states[i].size() * sizeof(float));
}

void load_parameters(const std::string& path, Model& model, Backend& backend, const MpiEnvironment& mpi) {
  const std::int64_t count = model.parameter_count();
  std::vector<float> parameters(static_cast<std::size_t>(count));
  read_or_damaged(path, [&] {
    const auto lock = lock_hdf5();
    H5Handle file = open_checkpoint(path, mpi);
    H5Handle transfer = collective_transfer();
    read_tensors(file.get(), path, tensor_entries(model, "/model"), parameters.data(), count, mpi, transfer.get());
  });
  backend.copy_to_backend(model.master(), parameters.data(), parameters.size() * sizeof(float));
  model.refresh_working_copy();
}

std::string checkpoint_run_id(const std::string& path) {
  try {
    const auto lock = lock_hdf5();
    H5Handle file = open_file_read_only(path, "checkpoint");
    return attribute_exists(file.get(), "run_id") ? read_string_attribute(file.get(), "run_id") : std::string();
  } catch (const Error&) {
    return {};
  }
}

fs::path resolve_checkpoint(const std::string& argument) {
  const fs::path given(argument);
  std::error_code error;
  fs::path directory;
  if (fs::is_directory(given / "checkpoints", error))
    directory = given / "checkpoints";  // a run directory
  else if (fs::is_directory(given, error))
    directory = given;  // a run's checkpoints/ directory
  else if (given.filename() == "latest")
    directory = given.parent_path();
  else
    return given;
  std::ifstream latest(directory / "latest");
  std::string name;
  HPCTRAIN_VERIFY(
      static_cast<bool>(latest >> name), InputError,
      "'" << argument << "' is a directory without a checkpoint (no " << (directory / "latest").string() << ")",
      "pass a checkpoint file (step-NNNNNNNN.h5) or a run directory that holds checkpoints");
  return directory / name;
}

std::string checkpoint_deck(const std::string& path) {
  const auto lock = lock_hdf5();
  H5Handle file = open_file_read_only(path, "checkpoint");
  HPCTRAIN_VERIFY(attribute_exists(file.get(), "format") &&
                      read_string_attribute(file.get(), "format") == checkpoint_format &&
                      attribute_exists(file.get(), "deck"),
                  InputError, "'" << path << "' is not an hpctrain checkpoint (" << checkpoint_format << ")",
                  "pass a file from a run's checkpoints/ directory");
  return read_string_attribute(file.get(), "deck");
}

std::string verify_checkpoint(const std::string& path) {
  try {
    const auto lock = lock_hdf5();
    H5Handle file = open_file_read_only(path, "checkpoint");
    if (!attribute_exists(file.get(), "format") || read_string_attribute(file.get(), "format") != checkpoint_format)
      return "not an hpctrain checkpoint";
    std::size_t checked = 0;
    for (const std::string& name : list_datasets(file.get())) {
      H5Handle dataset = open_dataset(file.get(), name);
      H5Handle space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset.get())));
      H5Handle type(HPCTRAIN_H5_CHECK(H5Dget_type(dataset.get())));
      const auto elements = static_cast<std::size_t>(H5Sget_simple_extent_npoints(space.get()));
      const std::size_t size = H5Tget_size(type.get());
      std::vector<unsigned char> bytes(elements * size);
      H5Handle native(HPCTRAIN_H5_CHECK(H5Tget_native_type(type.get(), H5T_DIR_DEFAULT)));
      HPCTRAIN_H5_CHECK(H5Dread(dataset.get(), native.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()));
      if (read_crc(dataset.get(), name, path) != crc32(bytes.data(), bytes.size()))
        return "dataset " + name + " fails its checksum";
      ++checked;
    }
    if (checked == 0) return "no datasets";
    return {};
  } catch (const Error& error) {
    return error.what();
  }
}

}  // namespace hpctrain
