// metrics.h5 writer: one extendible 1-D dataset per column, a flush after every row.
#include "hpctrain/io/metrics_writer.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"

namespace hpctrain {

namespace {

// Rows per chunk: 8 KiB of 8-byte values. Small enough that a flush per row rewrites little, large enough that a long
// run does not end up with millions of chunks.
constexpr hsize_t rows_per_chunk = 1024;

std::string column_path(const std::string& group, const std::string& column) { return "/" + group + "/" + column; }

std::string directory_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// What a row may add to the file: a new chunk of every column.
std::uintmax_t row_bytes(std::size_t columns) { return columns * rows_per_chunk * sizeof(double); }

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) : path_(path), file_(create_file(path)) {}

namespace {
H5Handle open_or_create_for_append(const std::string& path) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  if (access(path.c_str(), F_OK) != 0) return create_file(path);
  H5Handle access_list(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  return H5Handle(HPCTRAIN_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDWR, access_list.get())));
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, std::int64_t keep_through_step)
    : path_(path), file_(open_or_create_for_append(path)), keep_through_step_(keep_through_step) {}

void MetricsWriter::define(const std::string& group, const std::vector<std::pair<std::string, MetricKind>>& columns) {
  const auto lock = lock_hdf5();
  HPCTRAIN_ASSERT(file_.valid(), "metrics file '" << path_ << "' is closed");
  HPCTRAIN_ASSERT(!group.empty() && !group.starts_with('/') && !group.ends_with('/'),
                  "bad metrics group name '" << group << "'");
  HPCTRAIN_ASSERT(!tables_.contains(group), "metrics group '" << group << "' is defined twice");
  HPCTRAIN_ASSERT(!columns.empty(), "metrics group '" << group << "' has no columns");
  std::set<std::string> names;
  for (const auto& [name, kind] : columns) {
    HPCTRAIN_ASSERT(!name.empty() && name.find('/') == std::string::npos, "bad metrics column name '" << name << "'");
    HPCTRAIN_ASSERT(names.insert(name).second, "metrics column '" << name << "' appears twice in '" << group << "'");
  }

  writing(row_bytes(columns.size()), [&] { create_table(group, columns); });
}

void MetricsWriter::create_table(const std::string& group,
                                 const std::vector<std::pair<std::string, MetricKind>>& columns) {
  // "eval/validation" needs "eval" first; a group may also already exist as the parent of one defined earlier.
  if (!link_exists(file_.get(), "/" + group)) {
    H5Handle link_creation(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
    HPCTRAIN_H5_CHECK(H5Pset_create_intermediate_group(link_creation.get(), 1));
    H5Handle created(HPCTRAIN_H5_CHECK(
        H5Gcreate2(file_.get(), ("/" + group).c_str(), link_creation.get(), H5P_DEFAULT, H5P_DEFAULT)));
  }

  if (keep_through_step_ >= 0 && link_exists(file_.get(), column_path(group, columns.front().first))) {
    // Resuming: reuse the table, cut back to the rows up to the checkpoint's step.
    Table table;
    for (const auto& [name, kind] : columns)
      table.columns.push_back(Column{name, kind, open_dataset(file_.get(), column_path(group, name))});
    H5Handle space(HPCTRAIN_H5_CHECK(H5Dget_space(table.columns.front().dataset.get())));
    std::vector<std::int64_t> steps(
        static_cast<std::size_t>(HPCTRAIN_H5_CHECK(H5Sget_simple_extent_npoints(space.get()))));
    if (!steps.empty())
      HPCTRAIN_H5_CHECK(
          H5Dread(table.columns.front().dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()));
    hsize_t kept = 0;
    while (kept < steps.size() && steps[kept] <= keep_through_step_) ++kept;
    for (Column& column : table.columns) HPCTRAIN_H5_CHECK(H5Dset_extent(column.dataset.get(), &kept));
    table.rows = static_cast<std::int64_t>(kept);
    tables_.emplace(group, std::move(table));
    flush();
    return;
  }
  const hsize_t empty = 0, unlimited = H5S_UNLIMITED;
  H5Handle space(HPCTRAIN_H5_CHECK(H5Screate_simple(1, &empty, &unlimited)));
  H5Handle creation(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  HPCTRAIN_H5_CHECK(H5Pset_chunk(creation.get(), 1, &rows_per_chunk));
  Table table;
  for (const auto& [name, kind] : columns) {
    const hid_t stored_type = kind == MetricKind::int64 ? H5T_STD_I64LE : H5T_IEEE_F64LE;
    H5Handle dataset(HPCTRAIN_H5_CHECK(H5Dcreate2(file_.get(), column_path(group, name).c_str(), stored_type,
                                                  space.get(), H5P_DEFAULT, creation.get(), H5P_DEFAULT)));
    table.columns.push_back(Column{name, kind, std::move(dataset)});
  }
  tables_.emplace(group, std::move(table));
  flush();  // empty tables show up in a run that dies before its first row
}

const MetricsWriter::Table& MetricsWriter::table(const std::string& group) const {
  const auto found = tables_.find(group);
  HPCTRAIN_ASSERT(found != tables_.end(), "metrics group '" << group << "' was not defined");
  return found->second;
}

void MetricsWriter::append(const std::string& group, const std::vector<double>& values) {
  const auto lock = lock_hdf5();
  HPCTRAIN_ASSERT(file_.valid(), "metrics file '" << path_ << "' is closed");
  const auto found = tables_.find(group);
  HPCTRAIN_ASSERT(found != tables_.end(), "metrics group '" << group << "' was not defined");
  Table& destination = found->second;
  HPCTRAIN_ASSERT(values.size() == destination.columns.size(), "metrics group '"
                                                                   << group << "' has " << destination.columns.size()
                                                                   << " columns but the row has " << values.size());
  writing(row_bytes(values.size()), [&] { append_row(group, destination, values); });
}

void MetricsWriter::append_row(const std::string& group, Table& destination, const std::vector<double>& values) {
  const hsize_t new_rows = static_cast<hsize_t>(destination.rows) + 1;
  const hsize_t row = static_cast<hsize_t>(destination.rows), one = 1;
  H5Handle memory_space(HPCTRAIN_H5_CHECK(H5Screate_simple(1, &one, nullptr)));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Column& column = destination.columns[i];
    HPCTRAIN_H5_CHECK(H5Dset_extent(column.dataset.get(), &new_rows));
    H5Handle file_space(HPCTRAIN_H5_CHECK(H5Dget_space(column.dataset.get())));
    HPCTRAIN_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &row, nullptr, &one, nullptr));
    if (column.kind == MetricKind::int64) {
      HPCTRAIN_ASSERT(std::isfinite(values[i]) && std::abs(values[i]) < 9.2e18,
                      "metrics column '" << group << "/" << column.name << "' holds integers but got " << values[i]);
      const std::int64_t value = std::llround(values[i]);
      HPCTRAIN_H5_CHECK(
          H5Dwrite(column.dataset.get(), H5T_NATIVE_INT64, memory_space.get(), file_space.get(), H5P_DEFAULT, &value));
    } else {
      HPCTRAIN_H5_CHECK(H5Dwrite(column.dataset.get(), H5T_NATIVE_DOUBLE, memory_space.get(), file_space.get(),
                                 H5P_DEFAULT, &values[i]));
    }
  }
  destination.rows = static_cast<std::int64_t>(new_rows);
  flush();
}

std::int64_t MetricsWriter::rows(const std::string& group) const { return table(group).rows; }

void MetricsWriter::set_attribute(const std::string& name, const std::string& value) {
  const auto lock = lock_hdf5();
  HPCTRAIN_ASSERT(file_.valid(), "metrics file '" << path_ << "' is closed");
  writing(0, [&] {
    write_string_attribute(file_.get(), name, value);
    flush();
  });
}

void MetricsWriter::set_number_attribute(const std::string& name, double value) {
  const auto lock = lock_hdf5();
  HPCTRAIN_ASSERT(file_.valid(), "metrics file '" << path_ << "' is closed");
  writing(0, [&] {
    write_float_attribute(file_.get(), name, value);
    flush();
  });
}

void MetricsWriter::set_integer_attribute(const std::string& name, std::int64_t value) {
  const auto lock = lock_hdf5();
  HPCTRAIN_ASSERT(file_.valid(), "metrics file '" << path_ << "' is closed");
  writing(0, [&] {
    write_integer_attribute(file_.get(), name, value);
    flush();
  });
}

void MetricsWriter::remove_attribute(const std::string& name) {
  const auto lock = lock_hdf5();
  HPCTRAIN_ASSERT(file_.valid(), "metrics file '" << path_ << "' is closed");
  if (!attribute_exists(file_.get(), name)) return;
  writing(0, [&] {
    HPCTRAIN_H5_CHECK(H5Adelete(file_.get(), name.c_str()));
    flush();
  });
}

void MetricsWriter::flush() { HPCTRAIN_H5_CHECK(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL)); }

void MetricsWriter::close() {
  const auto lock = lock_hdf5();
  writing(0, [&] {
    for (auto& [group, table] : tables_)
      for (Column& column : table.columns) column.dataset.close();
    tables_.clear();
    file_.close();
  });
}

void MetricsWriter::writing(std::uintmax_t needed_bytes, const std::function<void()>& write) {
  try {
    write();
  } catch (const LibraryError& error) {
    // Close now, quietly (it fails too); a close that fails leaves HDF5 unable to shut down cleanly.
    bool closed = true;
    for (auto& [group, table] : tables_)
      for (Column& column : table.columns) closed = H5Dclose(column.dataset.release()) >= 0 && closed;
    tables_.clear();
    if (file_.valid()) closed = H5Fclose(file_.release()) >= 0 && closed;
    H5Eclear2(H5E_DEFAULT);
    if (!closed) mark_shutdown_unsafe();
    throw Error(
        "writing the metrics file '" + path_ + "' failed: " +
            write_failure_reason(error.error_number(), error.detail(), path_, needed_bytes, "a new row of metrics"),
        ErrorScope::this_rank,
        "make room in " + directory_of(path_) +
            " (free space, quota, file-size limit); metrics.h5 keeps the rows "
            "written so far");
  }
}

}  // namespace hpctrain
