// Row reads from one HDF5 dataset: hyperslab selections of exactly the requested rows, type conversion by HDF5.
#include "hpctrain/data/hdf5_dataset.hpp"

#include <algorithm>
#include <cstring>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

namespace {

constexpr std::size_t runs_per_leaf = 64;            // hyperslabs OR-ed directly before merging selections
constexpr std::size_t chunk_cache_bytes = 32 << 20;  // per open dataset
constexpr std::size_t chunk_cache_slots = 10007;     // a prime, ~100 x the chunks that fit (HDF5's advice)

// "it has: /a, /b" for the message about a missing dataset; long listings are cut short.
std::string available_datasets_text(hid_t file) {
  const std::vector<std::string> datasets = list_datasets(file);
  if (datasets.empty()) return "it has no datasets";
  constexpr std::size_t listed_at_most = 20;
  std::string text = "it has: ";
  for (std::size_t i = 0; i < datasets.size() && i < listed_at_most; ++i) text += (i > 0 ? ", " : "") + datasets[i];
  if (datasets.size() > listed_at_most) text += ", ... (" + std::to_string(datasets.size() - listed_at_most) + " more)";
  return text;
}

}  // namespace

Hdf5Dataset::Hdf5Dataset(const std::string& file, const std::string& dataset_path)
    : file_name_(file), dataset_path_(dataset_path.starts_with('/') ? dataset_path : "/" + dataset_path) {
  const auto lock = lock_hdf5();
  file_ = open_file_read_only(file, "data file");
  const std::string where = "'" + dataset_path_ + "' in '" + file_name_ + "'";
  const std::string inspect_hint = "'hpctrain data inspect " + file_name_ + "' describes the file";
  if (!link_exists(file_.get(), dataset_path_)) {
    throw InputError(
        "dataset '" + dataset_path_ + "' not found in '" + file_name_ + "'; " + available_datasets_text(file_.get()),
        inspect_hint);
  }
  {
    const H5Handle object(HPCTRAIN_H5_CHECK(H5Oopen(file_.get(), dataset_path_.c_str(), H5P_DEFAULT)));
    if (HPCTRAIN_H5_CHECK(H5Iget_type(object.get())) != H5I_DATASET)
      throw InputError(where + " is a group, not a dataset; " + available_datasets_text(file_.get()), inspect_hint);
  }
  // Random rows touch chunks all over the file: a chunk cache far above HDF5's default 1 MiB keeps a dataset of modest
  // size in memory after the first epoch, instead of re-reading a whole chunk for every row.
  H5Handle access(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)));
  HPCTRAIN_H5_CHECK(H5Pset_chunk_cache(access.get(), chunk_cache_slots, chunk_cache_bytes, H5D_CHUNK_CACHE_W0_DEFAULT));
  dataset_ = H5Handle(HPCTRAIN_H5_CHECK(H5Dopen2(file_.get(), dataset_path_.c_str(), access.get())));

  file_space_ = H5Handle(HPCTRAIN_H5_CHECK(H5Dget_space(dataset_.get())));
  shape_ = dataspace_shape(file_space_.get());
  HPCTRAIN_VERIFY(!shape_.empty(), InputError,
                  "dataset " << where << " is a single value; expected one row per sample (at least one dimension)");
  for (std::size_t d = 1; d < shape_.size(); ++d) sample_size_ *= shape_[d];

  H5Handle stored_type(HPCTRAIN_H5_CHECK(H5Dget_type(dataset_.get())));
  type_name_ = hpctrain::type_name(stored_type.get());
  const H5T_class_t type_class = HPCTRAIN_H5_CHECK(H5Tget_class(stored_type.get()));
  HPCTRAIN_VERIFY(type_class == H5T_INTEGER || type_class == H5T_FLOAT, InputError,
                  "dataset " << where << " holds " << type_name_ << " values; expected integers or floating point",
                  "store numbers: uint8, int16, int32, float16, float32 or float64 (converted to float32 on load); "
                  "'hpctrain data convert' writes such files from .npy or CSV");
  stores_integers_ = type_class == H5T_INTEGER;
  stored_type_ = std::move(stored_type);
  stored_value_bytes_ = H5Tget_size(stored_type_.get());
}

void Hdf5Dataset::read_rows(const std::int64_t* indices, std::int64_t count, float* out) {
  const auto lock = lock_hdf5();  // taken before H5T_NATIVE_*, which are HDF5 calls too
  read_rows_as(H5T_NATIVE_FLOAT, sizeof(float), indices, count, out);
}

void Hdf5Dataset::read_rows(const std::int64_t* indices, std::int64_t count, std::int32_t* out) {
  const auto lock = lock_hdf5();
  read_rows_as(H5T_NATIVE_INT32, sizeof(std::int32_t), indices, count, out);
}

void Hdf5Dataset::read_range(std::int64_t first, std::int64_t count, float* out) {
  const auto lock = lock_hdf5();
  read_range_as(H5T_NATIVE_FLOAT, first, count, out);
}

void Hdf5Dataset::read_range(std::int64_t first, std::int64_t count, std::int32_t* out) {
  const auto lock = lock_hdf5();
  read_range_as(H5T_NATIVE_INT32, first, count, out);
}

void Hdf5Dataset::read_range(std::int64_t first, std::int64_t count, double* out) {
  const auto lock = lock_hdf5();
  read_range_as(H5T_NATIVE_DOUBLE, first, count, out);
}

void Hdf5Dataset::read_rows_stored(const std::int64_t* indices, std::int64_t count, void* out) {
  const auto lock = lock_hdf5();
  read_rows_as(stored_type_.get(), stored_value_bytes_, indices, count, out);
}

hid_t Hdf5Dataset::select_rows(const std::int64_t* rows, std::int64_t count) {
  runs_.clear();
  for (std::int64_t run_begin = 0; run_begin < count;) {
    std::int64_t run_end = run_begin + 1;
    while (run_end < count && rows[run_end] == rows[run_end - 1] + 1) ++run_end;
    runs_.emplace_back(rows[run_begin], run_end - run_begin);
    run_begin = run_end;
  }
  if (runs_.size() <= runs_per_leaf) {
    select_runs(file_space_.get(), 0, runs_.size());
    return file_space_.get();
  }
  combined_selection_ = combine_runs(0, runs_.size());
  return combined_selection_.get();
}

void Hdf5Dataset::select_runs(hid_t space, std::size_t first_run, std::size_t end_run) {
  hsize_t start[H5S_MAX_RANK] = {}, block[H5S_MAX_RANK] = {};
  std::copy(shape_.begin(), shape_.end(), block);  // whole rows: every dimension but the first in full
  for (std::size_t run = first_run; run < end_run; ++run) {
    start[0] = static_cast<hsize_t>(runs_[run].first);
    block[0] = static_cast<hsize_t>(runs_[run].second);
    HPCTRAIN_H5_CHECK(
        H5Sselect_hyperslab(space, run == first_run ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, block, nullptr));
  }
}

// OR-ing hyperslabs one at a time costs time proportional to the selection so far (quadratic overall: seconds for a
// batch of 16k rows in HDF5 1.10); merging halves pairwise keeps it near linear.
H5Handle Hdf5Dataset::combine_runs(std::size_t first_run, std::size_t end_run) {
  if (end_run - first_run <= runs_per_leaf) {
    H5Handle space(HPCTRAIN_H5_CHECK(H5Scopy(file_space_.get())));
    select_runs(space.get(), first_run, end_run);
    return space;
  }
  const std::size_t middle = first_run + (end_run - first_run) / 2;
  const H5Handle left = combine_runs(first_run, middle), right = combine_runs(middle, end_run);
  return H5Handle(HPCTRAIN_H5_CHECK(H5Scombine_select(left.get(), H5S_SELECT_OR, right.get())));
}

void Hdf5Dataset::read_selection(hid_t memory_type, hid_t selection, std::int64_t selected_rows, void* out) {
  const hsize_t memory_shape[2] = {static_cast<hsize_t>(selected_rows), static_cast<hsize_t>(sample_size_)};
  H5Handle memory_space(HPCTRAIN_H5_CHECK(H5Screate_simple(2, memory_shape, nullptr)));
  HPCTRAIN_H5_CHECK(H5Dread(dataset_.get(), memory_type, memory_space.get(), selection, H5P_DEFAULT, out));
}

void Hdf5Dataset::read_rows_as(hid_t memory_type, std::size_t value_bytes, const std::int64_t* indices,
                               std::int64_t count, void* out) {
  HPCTRAIN_ASSERT(count >= 0, "negative row count " << count);
  if (count == 0 || sample_size_ == 0) return;
  bool strictly_increasing = true;
  for (std::int64_t i = 0; i < count; ++i) {
    HPCTRAIN_ASSERT(indices[i] >= 0 && indices[i] < samples(), "row " << indices[i] << " is outside [0, " << samples()
                                                                      << ") of '" << dataset_path_ << "' in '"
                                                                      << file_name_ << "'");
    if (i > 0 && indices[i] <= indices[i - 1]) strictly_increasing = false;
  }
  if (strictly_increasing) {  // the selection's file order is the requested order: read straight into out
    read_selection(memory_type, select_rows(indices, count), count, out);
    return;
  }

  // HDF5 delivers a selection in file order, once per row: read each distinct row once, then place copies as asked.
  sorted_requests_.resize(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) sorted_requests_[static_cast<std::size_t>(i)] = {indices[i], i};
  std::sort(sorted_requests_.begin(), sorted_requests_.end());
  unique_rows_.clear();
  slot_of_request_.resize(static_cast<std::size_t>(count));
  for (const auto& [row, position] : sorted_requests_) {
    if (unique_rows_.empty() || unique_rows_.back() != row) unique_rows_.push_back(row);
    slot_of_request_[static_cast<std::size_t>(position)] = static_cast<std::int64_t>(unique_rows_.size()) - 1;
  }
  const std::int64_t unique_count = static_cast<std::int64_t>(unique_rows_.size());
  const std::size_t row_bytes = static_cast<std::size_t>(sample_size_) * value_bytes;
  gathered_.resize(static_cast<std::size_t>(unique_count) * row_bytes);  // (unique rows, sample_size)
  read_selection(memory_type, select_rows(unique_rows_.data(), unique_count), unique_count, gathered_.data());
  auto* destination = static_cast<unsigned char*>(out);  // (count, sample_size)
  for (std::int64_t i = 0; i < count; ++i) {
    std::memcpy(destination + static_cast<std::size_t>(i) * row_bytes,
                gathered_.data() + static_cast<std::size_t>(slot_of_request_[static_cast<std::size_t>(i)]) * row_bytes,
                row_bytes);
  }
}

void Hdf5Dataset::read_range_as(hid_t memory_type, std::int64_t first, std::int64_t count, void* out) {
  HPCTRAIN_ASSERT(first >= 0 && count >= 0 && first + count <= samples(),
                  "rows [" << first << ", " << first + count << ") are outside [0, " << samples() << ") of '"
                           << dataset_path_ << "' in '" << file_name_ << "'");
  if (count == 0 || sample_size_ == 0) return;
  hsize_t start[H5S_MAX_RANK] = {}, block[H5S_MAX_RANK] = {};
  std::copy(shape_.begin(), shape_.end(), block);
  start[0] = static_cast<hsize_t>(first);
  block[0] = static_cast<hsize_t>(count);
  HPCTRAIN_H5_CHECK(H5Sselect_hyperslab(file_space_.get(), H5S_SELECT_SET, start, nullptr, block, nullptr));
  read_selection(memory_type, file_space_.get(), count, out);
}

}  // namespace hpctrain
