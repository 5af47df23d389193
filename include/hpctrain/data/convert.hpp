// Writing data files in hpctrain's layout (/features plus /labels or /targets, one row per sample) from other formats,
// and carving a validation set out of a file: what `hpctrain data convert` and `hpctrain data split` do.
//
// Every writer streams in bounded blocks (files of any size). An uncompressed dataset of known size is one contiguous,
// preallocated extent written in whole 2 MiB pieces (io/hdf5.hpp: the layout random row reads are fastest on); with
// `compress`, or when the row count is not known in advance (CSV), datasets are chunked along the sample axis in chunks
// of about 1 MiB (one chunk holds whole samples; a random sample costs one chunk read), and `compress` applies the
// shuffle filter and gzip level 4 (a good size/speed balance for numeric data). Callers write to a temporary name and
// rename.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

// Rows per chunk (of a chunked dataset) for samples of `row_bytes` bytes: about 1 MiB of whole samples, at least one,
// at most `rows` (when known, > 0).
std::int64_t chunk_rows_for(std::int64_t row_bytes, std::int64_t rows);

// One dataset being written row block by row block. rows < 0: the count is not known in advance (CSV) and the dataset
// grows with every append.
class DatasetWriter {
 public:
  DatasetWriter(hid_t file, const std::string& path, hid_t file_type, const std::vector<std::int64_t>& sample_shape,
                std::int64_t rows, bool compress);
  // Appends `rows` samples of values of memory_type, (rows, sample values), after those written so far.
  void append(const void* values, hid_t memory_type, std::int64_t rows);
  [[nodiscard]] std::int64_t rows_written() const { return written_; }
  // Closes the dataset, reporting a failure (lost data) as an error.
  void close();

 private:
  H5Handle dataset_;
  std::vector<std::int64_t> sample_shape_;
  std::int64_t rows_ = 0, written_ = 0;
  bool growing_ = false;
};

// An HDF5 type that stores IEEE half precision (HDF5 1.10 has no predefined one), as h5py writes numpy.float16.
H5Handle float16_file_type();

struct NpyConversion {
  std::string features;  // .npy of shape (N, ...), rank >= 2
  std::string answers;   // .npy of labels (N) or (N, 1), or targets (N) or (N, K)
  bool answers_are_labels = true;
  bool compress = false;
};

// Writes /features and /labels (int32) or /targets (float32) to `output`, features in their .npy element type.
// Returns a one-line summary.
std::string convert_npy(const NpyConversion& conversion, const std::string& output);

struct CsvConversion {
  std::string csv;
  std::string label_column;  // a name (with header) or a 0-based index; negative counts from the end
  bool header = false;
  bool targets = false;  // the column is a regression target (/targets (N, 1) float32) rather than a class label
  bool compress = false;
};

// Writes every other column as /features (N, F) float32 and the chosen column as /labels (N) int32 (whole numbers
// only) or /targets (N, 1) float32. Empty lines are skipped. Returns a one-line summary.
std::string convert_csv(const CsvConversion& conversion, const std::string& output);

struct SplitRequest {
  std::string input;
  double validation_fraction = 0.1;
  std::uint64_t seed = 0;
  bool shuffle = false;  // write the samples in random order (for data.shuffle = "local"); else in file order
  bool compress = false;
};

// Splits every dataset whose first dimension is the number of samples (that of /features): the first
// round(fraction * N) samples of torch.randperm(N, seed) go to validation, the rest to train. Values keep their stored
// types. Returns a one-line summary.
std::string split_dataset(const SplitRequest& request, const std::string& train_output,
                          const std::string& validation_output);

}  // namespace hpctrain
