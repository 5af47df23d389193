// Converters to hpctrain's HDF5 layout (.npy, CSV) and the train/validation split, all streaming in bounded blocks.
#include "hpctrain/data/convert.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/core/half.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/data/distributed_sampler.hpp"
#include "hpctrain/data/hdf5_dataset.hpp"
#include "hpctrain/data/npy.hpp"
#include "hpctrain/data/tokens.hpp"

namespace hpctrain {

namespace {

constexpr std::int64_t target_chunk_bytes = 1 << 20;  // ~1 MiB chunks: see convert.hpp
constexpr std::int64_t block_bytes = 16 << 20;        // rows converted per block: memory stays bounded
constexpr int gzip_level = 4;

std::int64_t product(const std::vector<std::int64_t>& dims) {
  std::int64_t count = 1;
  for (const std::int64_t d : dims) count *= d;
  return count;
}

// Whole 2 MiB pieces of the output where the row size allows (io/hdf5.hpp: the new file's pages then stay large).
std::int64_t block_rows_for(std::int64_t row_bytes) {
  return folio_block_rows(std::max<std::int64_t>(1, row_bytes), block_bytes);
}

// The little-endian HDF5 type that stores a .npy element type unchanged.
H5Handle file_type_for(const NpyHeader& header) {
  const auto lock = lock_hdf5();
  if (header.type_name == "float16") return float16_file_type();
  hid_t predefined = H5T_IEEE_F32LE;
  const std::string& name = header.type_name;
  if (name == "float64") predefined = H5T_IEEE_F64LE;
  if (name == "int8") predefined = H5T_STD_I8LE;
  if (name == "int16") predefined = H5T_STD_I16LE;
  if (name == "int32") predefined = H5T_STD_I32LE;
  if (name == "int64") predefined = H5T_STD_I64LE;
  if (name == "uint8") predefined = H5T_STD_U8LE;
  if (name == "uint16") predefined = H5T_STD_U16LE;
  if (name == "uint32") predefined = H5T_STD_U32LE;
  if (name == "uint64") predefined = H5T_STD_U64LE;
  return H5Handle(HPCTRAIN_H5_CHECK(H5Tcopy(predefined)));
}

// The value of one little-endian .npy element.
double element_value(const unsigned char* bytes, const NpyHeader& header) {
  std::uint64_t raw = 0;
  for (std::size_t i = 0; i < header.value_bytes; ++i) raw |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  if (header.is_float) {
    if (header.value_bytes == 2) return to_float(fp16{static_cast<std::uint16_t>(raw)});
    if (header.value_bytes == 4) return bits_float(static_cast<std::uint32_t>(raw));
    double value = 0;
    std::memcpy(&value, &raw, sizeof value);
    return value;
  }
  if (!header.is_signed) return static_cast<double>(raw);
  const unsigned shift = static_cast<unsigned>(64 - 8 * header.value_bytes);  // sign-extend
  return static_cast<double>(static_cast<std::int64_t>(raw << shift) >> shift);
}

// Streams the values of a .npy file block after block.
class NpyReader {
 public:
  NpyReader(const std::string& file, const NpyHeader& header) : file_(file), stream_(file, std::ios::binary) {
    HPCTRAIN_VERIFY(stream_, InputError, "cannot read '" << file << "'", "check the file's permissions");
    stream_.seekg(static_cast<std::streamoff>(header.data_offset));
  }
  void read(void* out, std::size_t bytes) {
    stream_.read(static_cast<char*>(out), static_cast<std::streamsize>(bytes));
    HPCTRAIN_VERIFY(static_cast<std::size_t>(stream_.gcount()) == bytes, InputError,
                    "reading '" << file_ << "' failed part way (the file changed or the disk failed)",
                    "run the conversion again");
  }

 private:
  std::string file_;
  std::ifstream stream_;
};

std::string shape_with(std::int64_t rows, const std::vector<std::int64_t>& sample_shape) {
  std::vector<std::int64_t> shape{rows};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  return shape_text(shape);
}

}  // namespace

std::int64_t chunk_rows_for(std::int64_t row_bytes, std::int64_t rows) {
  std::int64_t chunk_rows = std::max<std::int64_t>(1, target_chunk_bytes / std::max<std::int64_t>(1, row_bytes));
  if (rows > 0) chunk_rows = std::min(chunk_rows, rows);
  return chunk_rows;
}

H5Handle float16_file_type() {
  const auto lock = lock_hdf5();
  H5Handle type(HPCTRAIN_H5_CHECK(H5Tcopy(H5T_IEEE_F32LE)));
  // 1 sign bit at 15, 5 exponent bits at 10 (bias 15), 10 mantissa bits at 0.
  HPCTRAIN_H5_CHECK(H5Tset_fields(type.get(), 15, 10, 5, 0, 10));
  HPCTRAIN_H5_CHECK(H5Tset_size(type.get(), 2));
  HPCTRAIN_H5_CHECK(H5Tset_ebias(type.get(), 15));
  return type;
}

// --- DatasetWriter ---

DatasetWriter::DatasetWriter(hid_t file, const std::string& path, hid_t file_type,
                             const std::vector<std::int64_t>& sample_shape, std::int64_t rows, bool compress)
    : sample_shape_(sample_shape), rows_(rows), growing_(rows < 0) {
  const auto lock = lock_hdf5();
  for (const std::int64_t d : sample_shape)
    HPCTRAIN_VERIFY(
        d > 0, InputError,
        "cannot write '" << path << "': samples of shape " << shape_text(sample_shape) << " hold no values");
  const int rank = static_cast<int>(sample_shape.size()) + 1;
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), max_dims(dims.size()), chunk(dims.size());
  dims[0] = growing_ ? 0 : static_cast<hsize_t>(rows);
  max_dims[0] = growing_ ? H5S_UNLIMITED : dims[0];
  const std::int64_t row_bytes = product(sample_shape) * static_cast<std::int64_t>(H5Tget_size(file_type));
  chunk[0] = static_cast<hsize_t>(chunk_rows_for(row_bytes, growing_ ? -1 : rows));
  for (std::size_t d = 1; d < dims.size(); ++d)
    dims[d] = max_dims[d] = chunk[d] = static_cast<hsize_t>(sample_shape[d - 1]);

  H5Handle space(HPCTRAIN_H5_CHECK(H5Screate_simple(rank, dims.data(), max_dims.data())));
  // Uncompressed rows of a known count: one preallocated extent (io/hdf5.hpp), the fastest to read at random. Chunks
  // where the dataset grows or is compressed; an empty dataset stays contiguous: nothing to chunk.
  const bool chunked = growing_ || (compress && rows > 0);
  H5Handle creation =
      chunked || rows == 0 ? H5Handle(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE))) : row_dataset_layout();
  if (chunked) {
    HPCTRAIN_H5_CHECK(H5Pset_chunk(creation.get(), rank, chunk.data()));
    if (compress) {
      HPCTRAIN_H5_CHECK(H5Pset_shuffle(creation.get()));
      HPCTRAIN_H5_CHECK(H5Pset_deflate(creation.get(), gzip_level));
    }
  }
  H5Handle link_creation(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  HPCTRAIN_H5_CHECK(H5Pset_create_intermediate_group(link_creation.get(), 1));
  dataset_ = H5Handle(HPCTRAIN_H5_CHECK(
      H5Dcreate2(file, path.c_str(), file_type, space.get(), link_creation.get(), creation.get(), H5P_DEFAULT)));
}

void DatasetWriter::append(const void* values, hid_t memory_type, std::int64_t rows) {
  if (rows == 0) return;
  const auto lock = lock_hdf5();
  HPCTRAIN_ASSERT(growing_ || written_ + rows <= rows_, "writing past the end of a dataset");
  const std::size_t rank = sample_shape_.size() + 1;
  std::vector<hsize_t> start(rank, 0), count(rank), total(rank);
  start[0] = static_cast<hsize_t>(written_);
  count[0] = static_cast<hsize_t>(rows);
  total[0] = static_cast<hsize_t>(written_ + rows);
  for (std::size_t d = 1; d < rank; ++d) count[d] = total[d] = static_cast<hsize_t>(sample_shape_[d - 1]);
  if (growing_) HPCTRAIN_H5_CHECK(H5Dset_extent(dataset_.get(), total.data()));
  H5Handle file_space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset_.get())));
  HPCTRAIN_H5_CHECK(
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
  H5Handle memory_space(HPCTRAIN_H5_CHECK(H5Screate_simple(static_cast<int>(rank), count.data(), nullptr)));
  HPCTRAIN_H5_CHECK(H5Dwrite(dataset_.get(), memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, values));
  written_ += rows;
}

void DatasetWriter::close() {
  HPCTRAIN_ASSERT(growing_ || written_ == rows_, "wrote " << written_ << " of " << rows_ << " rows");
  dataset_.close();
}

// --- .npy ---

std::string convert_npy(const NpyConversion& conversion, const std::string& output) {
  const NpyHeader features = read_npy_header(conversion.features);
  const NpyHeader answers = read_npy_header(conversion.answers);
  const char* answers_name = conversion.answers_are_labels ? "labels" : "targets";
  HPCTRAIN_VERIFY(features.shape.size() >= 2, InputError,
                  "--features '" << conversion.features << "' has shape " << shape_text(features.shape)
                                 << "; features need one row per sample: (N, F), (N, C, H, W), ...",
                  "for one feature per sample, reshape to (N, 1): numpy.save(path, array.reshape(-1, 1))");
  HPCTRAIN_VERIFY(!answers.shape.empty() && answers.shape[0] == features.shape[0], InputError,
                  "--" << answers_name << " '" << conversion.answers << "' has shape " << shape_text(answers.shape)
                       << " but --features has " << features.shape[0] << " samples",
                  "the first dimension of both arrays counts the samples and must agree");
  if (conversion.answers_are_labels) {
    HPCTRAIN_VERIFY(answers.shape.size() == 1 || (answers.shape.size() == 2 && answers.shape[1] == 1), InputError,
                    "--labels '" << conversion.answers << "' has shape " << shape_text(answers.shape)
                                 << "; class labels are one whole number per sample, (N) or (N, 1)",
                    "for several values per sample use --targets (regression)");
  } else {
    HPCTRAIN_VERIFY(answers.shape.size() <= 2, InputError,
                    "--targets '" << conversion.answers << "' has shape " << shape_text(answers.shape)
                                  << "; targets are (N) or (N, K)",
                    "reshape to (N, K)");
  }
  const std::int64_t samples = features.shape[0];
  const std::vector<std::int64_t> sample_shape(features.shape.begin() + 1, features.shape.end());
  const std::int64_t answer_width = answers.shape.size() == 2 ? answers.shape[1] : 1;

  const auto lock = lock_hdf5();
  H5Handle file = create_data_file(output);
  {  // features: copied as stored, in blocks
    const H5Handle type = file_type_for(features);
    DatasetWriter writer(file.get(), "/features", type.get(), sample_shape, samples, conversion.compress);
    const std::int64_t row_bytes = product(sample_shape) * static_cast<std::int64_t>(features.value_bytes);
    const std::int64_t block = block_rows_for(row_bytes);
    std::vector<unsigned char> values(static_cast<std::size_t>(std::min(block, std::max<std::int64_t>(samples, 1)) *
                                                               row_bytes));  // (block, sample values) as stored
    NpyReader reader(conversion.features, features);
    for (std::int64_t first = 0; first < samples; first += block) {
      const std::int64_t rows = std::min(block, samples - first);
      reader.read(values.data(), static_cast<std::size_t>(rows * row_bytes));
      writer.append(values.data(), type.get(), rows);
    }
    writer.close();
  }
  {  // labels (int32, checked whole numbers) or targets (float32)
    const std::vector<std::int64_t> answer_shape =
        conversion.answers_are_labels ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{answer_width};
    DatasetWriter writer(file.get(), conversion.answers_are_labels ? "/labels" : "/targets",
                         conversion.answers_are_labels ? H5T_STD_I32LE : H5T_IEEE_F32LE, answer_shape, samples,
                         conversion.compress);
    const std::int64_t row_bytes = answer_width * static_cast<std::int64_t>(answers.value_bytes);
    const std::int64_t block = block_rows_for(row_bytes);
    std::vector<unsigned char> raw(static_cast<std::size_t>(std::min(block, std::max<std::int64_t>(samples, 1)) *
                                                            row_bytes));  // (block, K) as stored
    std::vector<std::int32_t> labels;                                     // (block)
    std::vector<float> targets;                                           // (block, K)
    NpyReader reader(conversion.answers, answers);
    for (std::int64_t first = 0; first < samples; first += block) {
      const std::int64_t rows = std::min(block, samples - first);
      reader.read(raw.data(), static_cast<std::size_t>(rows * row_bytes));
      const std::int64_t values = rows * answer_width;
      if (conversion.answers_are_labels) {
        labels.resize(static_cast<std::size_t>(values));
        for (std::int64_t i = 0; i < values; ++i) {
          const double value = element_value(raw.data() + i * static_cast<std::int64_t>(answers.value_bytes), answers);
          HPCTRAIN_VERIFY(value == std::floor(value) && value >= 0 && value <= std::numeric_limits<std::int32_t>::max(),
                          InputError,
                          "--labels '" << conversion.answers << "': label " << value << " of sample " << first + i
                                       << " is not a class number (a whole number >= 0)",
                          "class labels are 0, 1, ..., C-1; for real-valued answers use --targets");
          labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(value);
        }
        writer.append(labels.data(), H5T_NATIVE_INT32, rows);
      } else {
        targets.resize(static_cast<std::size_t>(values));
        for (std::int64_t i = 0; i < values; ++i)
          targets[static_cast<std::size_t>(i)] = static_cast<float>(
              element_value(raw.data() + i * static_cast<std::int64_t>(answers.value_bytes), answers));
        writer.append(targets.data(), H5T_NATIVE_FLOAT, rows);
      }
    }
    writer.close();
  }
  write_string_attribute(file.get(), "source", conversion.features + ", " + conversion.answers);
  write_string_attribute(file.get(), "created_by", std::string("hpctrain ") + HPCTRAIN_VERSION + " data convert");
  file.close();

  std::ostringstream summary;
  summary << "wrote " << output << ": /features " << shape_with(samples, sample_shape) << " " << features.type_name
          << ", ";
  if (conversion.answers_are_labels) {
    summary << "/labels (" << samples << ") int32";
  } else {
    summary << "/targets (" << samples << ", " << answer_width << ") float32";
  }
  summary << (conversion.compress ? ", gzip level 4 + shuffle" : "");
  return summary.str();
}

// --- CSV ---

namespace {

std::string trim_cell(std::string_view cell) {
  const auto first = cell.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  cell = cell.substr(first, cell.find_last_not_of(" \t") - first + 1);
  if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = cell.substr(1, cell.size() - 2);
  return std::string(cell);
}

void split_cells(const std::string& line, std::vector<std::string>& cells) {
  cells.clear();
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    cells.push_back(trim_cell(
        std::string_view(line).substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

}  // namespace

std::string convert_csv(const CsvConversion& conversion, const std::string& output) {
  const std::string& path = conversion.csv;
  require_regular_file(path, "CSV file");
  std::ifstream stream(path);
  HPCTRAIN_VERIFY(stream, InputError, "cannot read '" << path << "'", "check the path and the file's permissions");
  // A first quick pass counts the rows, so that the datasets get their final size and chunks no larger than the data.
  std::int64_t data_rows = conversion.header ? -1 : 0;
  for (std::string text; std::getline(stream, text);)
    if (text.find_first_not_of(" \t\r") != std::string::npos) ++data_rows;
  stream.clear();
  stream.seekg(0);

  std::vector<std::string> cells, names;
  std::string line;
  std::int64_t line_number = 0, columns = -1, columns_line = 0, label_column = -1;
  // Decides the label column once the column count is known (from the header or the first row).
  auto choose_label_column = [&] {
    const std::string& wanted = conversion.label_column;
    std::int64_t index = 0;
    const auto [end, error] = std::from_chars(wanted.data(), wanted.data() + wanted.size(), index);
    const bool is_index = !wanted.empty() && error == std::errc() && end == wanted.data() + wanted.size();
    if (!names.empty()) {
      const auto found = std::find(names.begin(), names.end(), wanted);
      if (found != names.end()) {
        label_column = found - names.begin();
        return;
      }
    }
    if (!is_index) {
      std::string listing;
      for (std::size_t i = 0; i < names.size() && i < 20; ++i) listing += (i ? ", " : "") + names[i];
      throw InputError("'" + path + "': no column named '" + wanted + "'" +
                           (names.empty() ? " (the file has no header: pass --header, or give a column index)"
                                          : " (the header has: " + listing + ")"),
                       "--label-column takes a column name from the header or an index counted from 0 (-1 = last)");
    }
    if (index < 0) index += columns;
    HPCTRAIN_VERIFY(index >= 0 && index < columns, InputError,
                    "'" << path << "': --label-column " << wanted << " is outside the " << columns << " columns",
                    "columns are counted from 0; -1 is the last one");
    label_column = index;
  };
  auto column_text = [&](std::int64_t column) {
    std::string text = "column " + std::to_string(column + 1);
    if (!names.empty()) text += " ('" + names[static_cast<std::size_t>(column)] + "')";
    return text;
  };

  const auto lock = lock_hdf5();
  H5Handle file = create_data_file(output);
  std::unique_ptr<DatasetWriter> features_writer, answers_writer;
  std::vector<float> features;       // (block, F)
  std::vector<std::int32_t> labels;  // (block)
  std::vector<float> targets;        // (block)
  std::int64_t block_rows = 0, buffered = 0;
  auto flush = [&] {
    features_writer->append(features.data(), H5T_NATIVE_FLOAT, buffered);
    if (conversion.targets) {
      answers_writer->append(targets.data(), H5T_NATIVE_FLOAT, buffered);
    } else {
      answers_writer->append(labels.data(), H5T_NATIVE_INT32, buffered);
    }
    buffered = 0;
  };

  bool header_pending = conversion.header;
  while (std::getline(stream, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    split_cells(line, cells);
    if (header_pending) {
      names = cells;
      columns = static_cast<std::int64_t>(cells.size());
      columns_line = line_number;
      header_pending = false;
      choose_label_column();
      continue;
    }
    if (columns < 0) {
      columns = static_cast<std::int64_t>(cells.size());
      columns_line = line_number;
      choose_label_column();
    }
    HPCTRAIN_VERIFY(static_cast<std::int64_t>(cells.size()) == columns, InputError,
                    "'" << path << "' line " << line_number << " has " << cells.size() << " columns, but line "
                        << columns_line << " has " << columns,
                    "every row needs the same number of comma-separated values");
    HPCTRAIN_VERIFY(columns >= 2, InputError,
                    "'" << path << "' has a single column: nothing is left for features besides the label",
                    "the file needs the label column and at least one feature column");
    if (!features_writer) {
      const std::int64_t width = columns - 1;
      features_writer = std::make_unique<DatasetWriter>(
          file.get(), "/features", H5T_IEEE_F32LE, std::vector<std::int64_t>{width}, data_rows, conversion.compress);
      answers_writer = std::make_unique<DatasetWriter>(
          file.get(), conversion.targets ? "/targets" : "/labels", conversion.targets ? H5T_IEEE_F32LE : H5T_STD_I32LE,
          conversion.targets ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{}, data_rows,
          conversion.compress);
      block_rows = std::min(block_rows_for(width * static_cast<std::int64_t>(sizeof(float))), data_rows);
      features.resize(static_cast<std::size_t>(block_rows * width));
      (conversion.targets ? targets.resize(static_cast<std::size_t>(block_rows))
                          : labels.resize(static_cast<std::size_t>(block_rows)));
    }
    std::int64_t feature = 0;
    for (std::int64_t column = 0; column < columns; ++column) {
      const std::string& cell = cells[static_cast<std::size_t>(column)];
      double value = 0;
      const auto [end, error] = std::from_chars(cell.data(), cell.data() + cell.size(), value);
      HPCTRAIN_VERIFY(!cell.empty() && error == std::errc() && end == cell.data() + cell.size(), InputError,
                      "'" << path << "' line " << line_number << ", " << column_text(column) << ": '" << cell
                          << "' is not a number",
                      cell.empty()
                          ? "fill in the empty cell or drop the row"
                          : (line_number == 1 && !conversion.header
                                 ? "if the first line names the columns, pass --header"
                                 : "every cell must be a number (decimal point '.', no thousands separators)"));
      if (column == label_column) {
        if (conversion.targets) {
          targets[static_cast<std::size_t>(buffered)] = static_cast<float>(value);
        } else {
          HPCTRAIN_VERIFY(value == std::floor(value) && value >= 0 && value <= std::numeric_limits<std::int32_t>::max(),
                          InputError,
                          "'" << path << "' line " << line_number << ", " << column_text(column) << ": label '" << cell
                              << "' is not a class number (a whole number >= 0)",
                          "class labels are 0, 1, ..., C-1; for a real-valued column use --target-column");
          labels[static_cast<std::size_t>(buffered)] = static_cast<std::int32_t>(value);
        }
      } else {
        features[static_cast<std::size_t>(buffered * (columns - 1) + feature++)] = static_cast<float>(value);
      }
    }
    if (++buffered == block_rows) flush();
  }
  HPCTRAIN_VERIFY(!stream.bad(), InputError, "reading '" << path << "' failed at line " << line_number);
  HPCTRAIN_VERIFY(features_writer != nullptr, InputError, "'" << path << "' holds no data rows",
                  "the file is empty" + std::string(conversion.header ? " apart from its header" : ""));
  if (buffered > 0) flush();
  const std::int64_t samples = features_writer->rows_written();
  features_writer->close();
  answers_writer->close();
  write_string_attribute(file.get(), "source", path);
  write_string_attribute(file.get(), "created_by", std::string("hpctrain ") + HPCTRAIN_VERSION + " data convert");
  file.close();

  std::ostringstream summary;
  summary << "wrote " << output << ": /features (" << samples << ", " << columns - 1 << ") float32, "
          << (conversion.targets ? "/targets (" + std::to_string(samples) + ", 1) float32"
                                 : "/labels (" + std::to_string(samples) + ") int32")
          << " from " << column_text(label_column) << (conversion.compress ? ", gzip level 4 + shuffle" : "");
  return summary.str();
}

// --- split ---

// --- token streams ---

std::string convert_tokens(const TokenConversion& conversion, const std::string& output,
                           const std::string& validation_output) {
  const bool from_ids = !conversion.ids.empty();
  std::int64_t total = 0;
  const std::int64_t vocabulary = from_ids ? conversion.vocabulary : 256;
  HPCTRAIN_VERIFY(vocabulary >= 1 && vocabulary <= max_vocabulary, InputError,
                  "--vocabulary " << vocabulary << " is outside [1, " << max_vocabulary << "]",
                  "give the tokenizer's vocabulary size (every id must be below it)");
  // The source, read block after block into int32 ids: the text files' bytes in order, or the .npy's values.
  std::function<void(std::int32_t*, std::int64_t, std::int64_t)> read_block;  // (out, first token, count)
  NpyHeader ids;
  std::unique_ptr<NpyReader> npy;
  std::vector<unsigned char> raw;  // (block) bytes as stored
  std::size_t text_index = 0;
  std::ifstream text;
  if (from_ids) {
    ids = read_npy_header(conversion.ids);
    HPCTRAIN_VERIFY(!ids.is_float, InputError,
                    "--tokens '" << conversion.ids << "' holds " << ids.type_name << " values; token ids are integers",
                    "save the ids as an integer array: numpy.save(path, ids.astype(numpy.int32))");
    total = ids.elements();
    npy = std::make_unique<NpyReader>(conversion.ids, ids);
    read_block = [&](std::int32_t* out, std::int64_t first, std::int64_t count) {
      raw.resize(static_cast<std::size_t>(count) * ids.value_bytes);
      npy->read(raw.data(), raw.size());
      for (std::int64_t i = 0; i < count; ++i) {
        const double id = element_value(raw.data() + static_cast<std::size_t>(i) * ids.value_bytes, ids);
        HPCTRAIN_VERIFY(id >= 0 && id < static_cast<double>(vocabulary), InputError,
                        "--tokens '" << conversion.ids << "': id " << number_text(id) << " at position " << first + i
                                     << " (counted from 0, C order) is outside [0, " << vocabulary
                                     << "), the --vocabulary",
                        "pass the tokenizer's vocabulary size as --vocabulary (every id must be below it), or fix "
                        "the ids");
        out[i] = static_cast<std::int32_t>(id);
      }
    };
  } else {
    HPCTRAIN_VERIFY(!conversion.texts.empty(), InputError, "no --text file given", "name one or more text files");
    for (const std::string& file : conversion.texts) {
      std::error_code error;
      const std::uintmax_t bytes = std::filesystem::file_size(file, error);
      HPCTRAIN_VERIFY(!error && std::filesystem::is_regular_file(file), InputError,
                      "--text '" << file << "' is not a readable file", "check the path");
      total += static_cast<std::int64_t>(bytes);
    }
    read_block = [&](std::int32_t* out, std::int64_t, std::int64_t count) {
      raw.resize(static_cast<std::size_t>(count));
      std::int64_t done = 0;
      while (done < count) {
        if (!text.is_open()) {
          text.open(conversion.texts[text_index], std::ios::binary);
          HPCTRAIN_VERIFY(text, InputError, "cannot read '" << conversion.texts[text_index] << "'",
                          "check the file's permissions");
        }
        text.read(reinterpret_cast<char*>(raw.data() + done), static_cast<std::streamsize>(count - done));
        done += text.gcount();
        if (done < count) {  // this file is done: the next one
          HPCTRAIN_VERIFY(text.eof() && text_index + 1 < conversion.texts.size(), InputError,
                          "reading '" << conversion.texts[text_index] << "' failed part way (the file changed)",
                          "run the conversion again");
          text.close();
          text.clear();
          ++text_index;
        }
      }
      for (std::int64_t i = 0; i < count; ++i) out[i] = raw[static_cast<std::size_t>(i)];
    };
  }
  const double fraction = conversion.validation_fraction;
  HPCTRAIN_VERIFY(fraction >= 0 && fraction < 1, InputError,
                  "--validation-fraction " << number_text(fraction) << " is outside [0, 1)",
                  "give the share of the tokens for validation, e.g. 0.1");
  const std::int64_t validation_tokens = std::llround(fraction * static_cast<double>(total));
  const std::int64_t train_tokens = total - validation_tokens;
  HPCTRAIN_VERIFY(train_tokens >= 2 && (fraction == 0 || validation_tokens >= 2), InputError,
                  "the input holds " << total << " tokens: too few for " << train_tokens << " training and "
                                     << validation_tokens << " validation tokens (each part needs at least 2)",
                  "give more text or ids, or a different --validation-fraction");

  const std::string type = token_type_for(vocabulary);
  const hid_t file_type = type == "uint8" ? H5T_STD_U8LE : type == "uint16" ? H5T_STD_U16LE : H5T_STD_I32LE;
  const auto lock = lock_hdf5();
  struct Output {
    H5Handle file;
    std::unique_ptr<DatasetWriter> writer;
  };
  std::vector<Output> outputs;
  for (const auto& [path, count] : {std::pair{output, train_tokens}, std::pair{validation_output, validation_tokens}}) {
    if (count == 0) continue;
    Output out{create_data_file(path), nullptr};
    out.writer = std::make_unique<DatasetWriter>(out.file.get(), tokens_dataset, file_type, std::vector<std::int64_t>{},
                                                 count, conversion.compress);
    outputs.push_back(std::move(out));
  }
  const std::int64_t block = block_bytes / static_cast<std::int64_t>(sizeof(std::int32_t));
  std::vector<std::int32_t> values(static_cast<std::size_t>(std::min(block, total)));  // (block) ids
  for (std::int64_t first = 0; first < total; first += block) {
    const std::int64_t count = std::min(block, total - first);
    read_block(values.data(), first, count);
    const std::int64_t to_train = std::clamp<std::int64_t>(train_tokens - first, 0, count);
    outputs[0].writer->append(values.data(), H5T_NATIVE_INT32, to_train);
    if (to_train < count) outputs[1].writer->append(values.data() + to_train, H5T_NATIVE_INT32, count - to_train);
  }
  std::string source = from_ids ? conversion.ids : "";
  for (std::size_t i = 0; i < conversion.texts.size(); ++i) source += (i > 0 ? ", " : "") + conversion.texts[i];
  for (Output& out : outputs) {
    out.writer->close();
    write_integer_attribute(out.file.get(), vocabulary_attribute, vocabulary);
    if (conversion.sequence_length > 0)
      write_integer_attribute(out.file.get(), sequence_length_attribute, conversion.sequence_length);
    write_string_attribute(out.file.get(), "tokenizer", from_ids ? "ids" : "bytes");
    write_string_attribute(out.file.get(), "source", source);
    write_string_attribute(out.file.get(), "created_by", std::string("hpctrain ") + HPCTRAIN_VERSION + " data convert");
    out.file.close();
  }
  std::ostringstream summary;
  summary << "wrote " << output << ": " << train_tokens << " tokens (" << type << ", vocabulary " << vocabulary << ")";
  if (validation_tokens > 0) summary << "; " << validation_output << ": " << validation_tokens << " tokens";
  return summary.str();
}

std::string split_dataset(const SplitRequest& request, const std::string& train_output,
                          const std::string& validation_output) {
  const auto lock = lock_hdf5();
  std::vector<std::string> paths;
  {
    const H5Handle input = open_file_read_only(request.input, "data file");
    paths = list_datasets(input.get());
  }
  HPCTRAIN_VERIFY(std::find(paths.begin(), paths.end(), "/features") != paths.end(), InputError,
                  "'" << request.input << "' has no /features dataset, so its number of samples is unknown",
                  "'hpctrain data inspect " + request.input + "' lists its datasets");
  std::vector<std::unique_ptr<Hdf5Dataset>> datasets;
  const std::int64_t samples = Hdf5Dataset(request.input, "/features").samples();
  std::vector<std::string> skipped;
  for (const std::string& path : paths) {
    std::unique_ptr<Hdf5Dataset> dataset;
    try {
      dataset = std::make_unique<Hdf5Dataset>(request.input, path);
    } catch (const InputError&) {  // not numbers, or a scalar: not per-sample data
      skipped.push_back(path);
      continue;
    }
    if (dataset->samples() != samples) {
      skipped.push_back(path);
      continue;
    }
    datasets.push_back(std::move(dataset));
  }

  const double fraction = request.validation_fraction;
  HPCTRAIN_VERIFY(fraction > 0 && fraction < 1, InputError,
                  "--validation-fraction must be between 0 and 1 (got " << fraction << ")", "e.g. 0.1 for 10%");
  const auto validation_count = static_cast<std::int64_t>(std::llround(fraction * static_cast<double>(samples)));
  HPCTRAIN_VERIFY(validation_count >= 1 && validation_count < samples, InputError,
                  "--validation-fraction " << fraction << " of " << samples << " samples leaves "
                                           << (validation_count < 1 ? "no validation samples" : "no training samples"),
                  "choose a fraction that puts at least one sample on each side");
  // The same permutation as torch.randperm(N) with this seed: the first V samples are the validation set.
  std::vector<std::int64_t> order = torch_randperm(samples, request.seed);
  std::vector<std::int64_t> validation(order.begin(), order.begin() + validation_count);
  std::vector<std::int64_t> train(order.begin() + validation_count, order.end());
  if (!request.shuffle) {  // keep the file order: sequential reads, and a file sorted in time stays sorted
    std::sort(validation.begin(), validation.end());
    std::sort(train.begin(), train.end());
  }

  auto write_part = [&](const std::string& output, const std::vector<std::int64_t>& rows) {
    H5Handle file = create_data_file(output);
    std::vector<unsigned char> block;  // (block rows, sample values) in the stored type
    for (const auto& dataset : datasets) {
      const std::vector<std::int64_t> sample_shape(dataset->shape().begin() + 1, dataset->shape().end());
      DatasetWriter writer(file.get(), dataset->path(), dataset->stored_type(), sample_shape,
                           static_cast<std::int64_t>(rows.size()), request.compress);
      const std::int64_t row_bytes = dataset->sample_size() * static_cast<std::int64_t>(dataset->stored_value_bytes());
      const std::int64_t block_rows = block_rows_for(row_bytes);
      for (std::size_t first = 0; first < rows.size(); first += static_cast<std::size_t>(block_rows)) {
        const auto count = static_cast<std::int64_t>(std::min<std::size_t>(block_rows, rows.size() - first));
        block.resize(static_cast<std::size_t>(count * row_bytes));
        dataset->read_rows_stored(rows.data() + first, count, block.data());
        writer.append(block.data(), dataset->stored_type(), count);
      }
      writer.close();
    }
    write_string_attribute(file.get(), "source", request.input);
    write_float_attribute(file.get(), "validation_fraction", fraction);
    write_integer_attribute(file.get(), "split_seed", static_cast<std::int64_t>(request.seed));
    write_string_attribute(file.get(), "created_by", std::string("hpctrain ") + HPCTRAIN_VERSION + " data split");
    file.close();
  };
  write_part(train_output, train);
  write_part(validation_output, validation);

  std::ostringstream summary;
  summary << "split " << request.input << " (" << samples << " samples, seed " << request.seed << "): " << train.size()
          << " to " << train_output << ", " << validation.size() << " to " << validation_output << " (";
  for (std::size_t i = 0; i < datasets.size(); ++i) summary << (i ? ", " : "") << datasets[i]->path();
  summary << (request.shuffle ? "; rows shuffled" : "; rows in file order") << ")";
  if (!skipped.empty()) {
    summary << "; not per-sample, left out:";
    for (const auto& path : skipped) summary << " " << path;
  }
  return summary.str();
}

}  // namespace hpctrain
