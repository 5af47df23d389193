// One dataset of one HDF5 file, opened read-only, read by rows: the data loader's view of /features, /labels, /targets.
//
// A row is one sample: the dataset's first dimension counts samples and the remaining dimensions make up one sample
// (a (N, 28, 28) dataset has rows of 784 values). Reads touch exactly the requested rows in the file, so a rank never
// reads more than its share, and whatever type is stored (uint8, int16, int32, float16, float32, float64, ...) is
// converted to the type asked for. Not thread-safe: one object per reading thread.
//
// Two read paths. Uncompressed little-endian numbers, stored contiguously or in chunks that hold whole samples (what
// hpctrain's writers and h5py's defaults produce), are read directly: the file is memory-mapped read-only and each
// row is copied and converted from where HDF5 put it (chunk addresses looked up once, at open). Everything else
// (compressed chunks, chunks that split a sample, big-endian or unusual types) goes through HDF5 hyperslab selections
// and HDF5's conversion. The direct path exists because HDF5 1.10 maps an irregular selection of random rows onto
// chunks element by element: for 1 KiB samples it delivers about 20-80 MB/s from the page cache, the direct path
// gigabytes per second (see docs/data.md). It calls no HDF5 function, so it needs no lock_hdf5().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hpctrain/core/page_mapping.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

class Hdf5Dataset {
 public:
  // Throws InputError when the file is missing or not HDF5, or when the dataset is missing (listing those there are),
  // is a group, is a scalar or does not hold numbers.
  Hdf5Dataset(const std::string& file, const std::string& dataset_path);
  ~Hdf5Dataset();
  Hdf5Dataset(const Hdf5Dataset&) = delete;
  Hdf5Dataset& operator=(const Hdf5Dataset&) = delete;

  // Whether float reads (and int32 reads of integers) take the direct path.
  [[nodiscard]] bool reads_directly() const { return direct_ != nullptr; }
  // How the kernel maps the direct path's memory map of the file now (nothing without one, or without /proc).
  [[nodiscard]] std::optional<PageMapping> map_pages() const;

  [[nodiscard]] const std::string& file() const { return file_name_; }
  [[nodiscard]] const std::string& path() const { return dataset_path_; }
  [[nodiscard]] std::int64_t samples() const { return shape_.front(); }
  [[nodiscard]] const std::vector<std::int64_t>& shape() const { return shape_; }
  // Values per sample: the product of every dimension but the first (1 for a 1-D dataset).
  [[nodiscard]] std::int64_t sample_size() const { return sample_size_; }
  // The stored type, as io/hdf5.hpp names it ("uint8", "int32", "float32", ...).
  [[nodiscard]] const std::string& type_name() const { return type_name_; }
  [[nodiscard]] bool stores_integers() const { return stores_integers_; }

  // Reads rows indices[0..count) into out, row after row: out is (count, sample_size()). Indices may come in any order
  // and repeat; each must lie in [0, samples()). Only those rows are read from the file, in one H5Dread.
  void read_rows(const std::int64_t* indices, std::int64_t count, float* out);
  void read_rows(const std::int64_t* indices, std::int64_t count, std::int32_t* out);  // labels

  // Reads the rows [first, first + count) into out, (count, sample_size()).
  void read_range(std::int64_t first, std::int64_t count, float* out);
  void read_range(std::int64_t first, std::int64_t count, std::int32_t* out);
  void read_range(std::int64_t first, std::int64_t count, double* out);  // statistics in double precision

  // The stored type itself (HDF5 owns the handle; valid while this object lives) and its size: for copying values
  // unchanged (data split).
  [[nodiscard]] hid_t stored_type() const { return stored_type_.get(); }
  [[nodiscard]] std::size_t stored_value_bytes() const { return stored_value_bytes_; }
  // Like read_rows, but the values keep the stored type: out is (count, sample_size()) values of stored_value_bytes().
  void read_rows_stored(const std::int64_t* indices, std::int64_t count, void* out);

 private:
  void read_rows_as(hid_t memory_type, std::size_t value_bytes, const std::int64_t* indices, std::int64_t count,
                    void* out);
  void read_range_as(hid_t memory_type, std::int64_t first, std::int64_t count, void* out);
  // Selects rows[0..count) (strictly increasing): one hyperslab per run of consecutive rows, OR-ed together. Returns
  // the dataspace holding the selection (file_space_, or combined_selection_ for many runs).
  hid_t select_rows(const std::int64_t* rows, std::int64_t count);
  void select_runs(hid_t space, std::size_t first_run, std::size_t end_run);
  H5Handle combine_runs(std::size_t first_run, std::size_t end_run);
  // Reads the rows selected in `selection` (selected_rows of them, in file order) into out.
  void read_selection(hid_t memory_type, hid_t selection, std::int64_t selected_rows, void* out);

  // A file that shrinks while it is read (truncated, rewritten in place) is an error, never zeros or a crash.
  [[nodiscard]] std::uintmax_t file_size_now() const;
  void check_file_intact() const;
  template <class Copy>
  void read_mapped(Copy&& copy) const;  // copy() from the memory map, SIGBUS turned into that error

  std::string file_name_, dataset_path_;
  std::uintmax_t file_bytes_ = 0;         // the file's size when opened
  H5Handle file_, dataset_, file_space_;  // kept open for the life of the object: many small reads
  H5Handle combined_selection_;           // the selection of the latest read with many runs
  H5Handle stored_type_;
  std::size_t stored_value_bytes_ = 0;
  struct DirectReader;  // the memory map and chunk addresses of the direct path; null when HDF5 reads
  std::unique_ptr<DirectReader> direct_;
  [[nodiscard]] std::unique_ptr<DirectReader> make_direct_reader() const;
  std::vector<std::int64_t> shape_;
  std::int64_t sample_size_ = 1;
  std::string type_name_;
  bool stores_integers_ = false;

  // Scratch reused across reads: once warmed up, a read allocates nothing of ours (HDF5 still does, a little).
  std::vector<std::pair<std::int64_t, std::int64_t>> sorted_requests_;  // (row, position in the request)
  std::vector<std::pair<std::int64_t, std::int64_t>> runs_;             // (first row, rows) of consecutive rows
  std::vector<std::int64_t> unique_rows_;                               // (unique rows): sorted, no repeats
  std::vector<std::int64_t> slot_of_request_;                           // (count): which unique row each request gets
  std::vector<unsigned char> gathered_;                                 // (unique rows, sample_size) in file order
};

}  // namespace hpctrain
