// metrics.h5: the training curves of a run, written by rank 0 as it goes.
//
// Each group is a table ("/train": step, loss, learning_rate, ...) stored as one extendible 1-D dataset per column, so
// any tool reads a column as a plain array (h5py: f["train/loss"][:]). Every append is flushed to disk: a run that
// crashes or is killed keeps every row written before, and the file opens without repair (see create_file). A write
// that fails (a full disk) throws one Error that names the file and says why (write_failure_reason), and closes it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

enum class MetricKind { int64, float64 };

class MetricsWriter {
 public:
  // Creates the file, replacing any existing one.
  explicit MetricsWriter(const std::string& path);
  // A resumed run: open the existing file (create it if missing); define() then reuses existing tables, dropping rows
  // whose "step" column is past keep_through_step (written after the checkpoint the run resumes from).
  MetricsWriter(const std::string& path, std::int64_t keep_through_step);
  ~MetricsWriter() = default;  // closes the file; a failed close is only logged (use close() to see it)
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&&) noexcept = default;
  MetricsWriter& operator=(MetricsWriter&&) noexcept = default;

  // Declares a table: creates /group/column for each column, empty. A group may be nested ("eval/validation") and is
  // defined once.
  void define(const std::string& group, const std::vector<std::pair<std::string, MetricKind>>& columns);
  // Appends one row, values in the order the columns were defined (int64 columns get the value rounded), and flushes.
  void append(const std::string& group, const std::vector<double>& values);
  // Rows appended to a group so far.
  [[nodiscard]] std::int64_t rows(const std::string& group) const;
  // A string attribute on the root, for run metadata (deck name, version, start time); flushed.
  void set_attribute(const std::string& name, const std::string& value);
  // Numeric root attributes (float64, int64), replacing one of the same name; flushed.
  void set_number_attribute(const std::string& name, double value);
  void set_integer_attribute(const std::string& name, std::int64_t value);
  // Removes a root attribute if the file has it; flushed.
  void remove_attribute(const std::string& name);
  // Closes the file now and throws if that fails; the writer is unusable afterwards.
  void close();

  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  struct Column {
    std::string name;
    MetricKind kind;
    H5Handle dataset;
  };
  struct Table {
    std::vector<Column> columns;
    std::int64_t rows = 0;
  };
  const Table& table(const std::string& group) const;
  void create_table(const std::string& group, const std::vector<std::pair<std::string, MetricKind>>& columns);
  void append_row(const std::string& group, Table& destination, const std::vector<double>& values);
  void flush();
  // Runs write(); a failing HDF5 call becomes the Error above. needed_bytes: about what the write adds to the file.
  void writing(std::uintmax_t needed_bytes, const std::function<void()>& write);

  std::string path_;
  H5Handle file_;
  std::map<std::string, Table> tables_;
  std::int64_t keep_through_step_ = -1;  // >= 0: resuming
};

}  // namespace hpctrain
