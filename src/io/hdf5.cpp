// The thin HDF5 layer: owning handles, opening files with messages a user can act on, links, attributes, type names.
#include "hpctrain/io/hdf5.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/core/numbers.hpp"

namespace hpctrain {

namespace {

// The innermost frames of the HDF5 error stack, which say what went wrong ("truncated file: eof = ..."); clears it.
herr_t collect_error_frame(unsigned depth, const H5E_error2_t* frame, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (depth < 3 && frame->desc != nullptr && frame->desc[0] != '\0') {
    if (!text->empty()) *text += "; ";
    *text += frame->desc;
  }
  return 0;
}

std::string take_error_stack_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error_frame, &text);
  H5Eclear2(H5E_DEFAULT);
  return text;
}

herr_t close_by_type(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE:
      return H5Fclose(id);
    case H5I_GROUP:
      return H5Gclose(id);
    case H5I_DATASET:
      return H5Dclose(id);
    case H5I_DATASPACE:
      return H5Sclose(id);
    case H5I_DATATYPE:
      return H5Tclose(id);
    case H5I_ATTR:
      return H5Aclose(id);
    case H5I_GENPROP_LST:
      return H5Pclose(id);
    default:
      return -1;  // not an identifier we can own (already closed, or predefined)
  }
}

// A variable-length UTF-8 string type: h5py reads these as str rather than bytes.
H5Handle variable_string_type() {
  H5Handle type(HPCTRAIN_H5_CHECK(H5Tcopy(H5T_C_S1)));
  HPCTRAIN_H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  HPCTRAIN_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  return type;
}

H5Handle open_attribute(hid_t object, const std::string& name) {
  HPCTRAIN_VERIFY(HPCTRAIN_H5_CHECK(H5Aexists(object, name.c_str())) > 0, InputError,
                  "attribute '" << name << "' not found");
  return H5Handle(HPCTRAIN_H5_CHECK(H5Aopen(object, name.c_str(), H5P_DEFAULT)));
}

std::int64_t attribute_point_count(hid_t attribute) {
  H5Handle space(HPCTRAIN_H5_CHECK(H5Aget_space(attribute)));
  return HPCTRAIN_H5_CHECK(H5Sget_simple_extent_npoints(space.get()));
}

void write_attribute_bytes(hid_t object, const std::string& name, hid_t file_type, hid_t memory_type,
                           const void* value) {
  silence_hdf5_error_printing();
  if (HPCTRAIN_H5_CHECK(H5Aexists(object, name.c_str())) > 0) HPCTRAIN_H5_CHECK(H5Adelete(object, name.c_str()));
  H5Handle space(HPCTRAIN_H5_CHECK(H5Screate(H5S_SCALAR)));
  H5Handle attribute(
      HPCTRAIN_H5_CHECK(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  HPCTRAIN_H5_CHECK(H5Awrite(attribute.get(), memory_type, value));
}

}  // namespace

std::unique_lock<std::recursive_mutex> lock_hdf5() {
  static std::recursive_mutex mutex;
  return std::unique_lock<std::recursive_mutex>(mutex);
}

// --- H5Handle ---

H5Handle::~H5Handle() {
  if (!valid()) return;
  const auto lock = lock_hdf5();
  if (close_by_type(id_) < 0 && std::uncaught_exceptions() == 0) {
    const std::string detail = take_error_stack_text();
    std::fprintf(stderr, "hpctrain: warning: closing an HDF5 object failed%s%s\n", detail.empty() ? "" : ": ",
                 detail.c_str());
  }
}

H5Handle& H5Handle::operator=(H5Handle&& other) noexcept {
  if (this != &other) {
    H5Handle old(id_);  // closes the previous identifier (logging, not throwing) when it goes out of scope
    id_ = other.release();
  }
  return *this;
}

hid_t H5Handle::release() {
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  return id;
}

void H5Handle::close() {
  if (!valid()) return;
  const auto lock = lock_hdf5();
  HPCTRAIN_H5_CHECK(close_by_type(release()));
}

// --- files ---

void silence_hdf5_error_printing() {
  // The automatic-printing setting is per thread in thread-safe HDF5 builds, so remember it per thread.
  thread_local bool silenced = false;
  if (silenced) return;
  const auto lock = lock_hdf5();
  HPCTRAIN_H5_CHECK(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));
  silenced = true;
}

H5Handle open_file_read_only(const std::string& path, std::string_view description) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  require_regular_file(path, description);

  const std::string damaged = std::string(description) + " '" + path + "' is not an HDF5 file or is damaged";
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) {
    const std::string detail = take_error_stack_text();
    throw InputError(damaged + (detail.empty() ? "" : " (" + detail + ")"),
                     "hpctrain reads HDF5 files; 'hpctrain data generate' writes one, h5dump shows one");
  }

  // Locking is only for coordinating with writers; some parallel file systems lack flock, and read-only access does not
  // need it.
  H5Handle access(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  HPCTRAIN_H5_CHECK(H5Pset_file_locking(access.get(), false, true));
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get());
  if (file < 0) {
    const std::string detail = take_error_stack_text();
    throw InputError(damaged + (detail.empty() ? "" : " (" + detail + ")"),
                     "a file left by a crashed writer may be repaired with h5clear; otherwise regenerate it");
  }
  return H5Handle(file);
}

namespace {
H5Handle create_file_with(const std::string& path, hsize_t alignment_threshold) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  // The default (earliest) format keeps no "open for writing" flag in the superblock, so a file whose writer crashed
  // after a flush opens normally, without h5clear.
  H5Handle access(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  HPCTRAIN_H5_CHECK(H5Pset_file_locking(access.get(), false, true));
  if (alignment_threshold > 0)
    HPCTRAIN_H5_CHECK(H5Pset_alignment(access.get(), alignment_threshold, static_cast<hsize_t>(large_folio_bytes)));
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get());
  if (file < 0) {
    const std::string detail = take_error_stack_text();
    throw InputError("cannot create '" + path + "'" + (detail.empty() ? "" : " (" + detail + ")"),
                     "check that its directory exists and is writable", ErrorScope::this_rank);
  }
  return H5Handle(file);
}
}  // namespace

H5Handle create_file(const std::string& path) { return create_file_with(path, 0); }

H5Handle create_data_file(const std::string& path) {
  return create_file_with(path, static_cast<hsize_t>(aligned_object_bytes));
}

H5Handle row_dataset_layout() {
  H5Handle creation(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  HPCTRAIN_H5_CHECK(H5Pset_layout(creation.get(), H5D_CONTIGUOUS));
  HPCTRAIN_H5_CHECK(H5Pset_alloc_time(creation.get(), H5D_ALLOC_TIME_EARLY));
  HPCTRAIN_H5_CHECK(H5Pset_fill_time(creation.get(), H5D_FILL_TIME_NEVER));
  return creation;
}

std::int64_t folio_block_rows(std::int64_t row_bytes, std::int64_t most_bytes) {
  HPCTRAIN_ASSERT(row_bytes > 0, "rows of " << row_bytes << " bytes");
  const std::int64_t fit = std::max<std::int64_t>(1, most_bytes / row_bytes);
  const std::int64_t whole = large_folio_bytes / std::gcd(large_folio_bytes, row_bytes);  // rows in k * 2 MiB
  return fit >= whole ? fit / whole * whole : fit;
}

namespace {
int communicator_size(MPI_Comm comm) {
  int ranks = 0;
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(comm, &ranks));
  return ranks;
}

// One process alone uses HDF5's POSIX driver: MPI-IO's set-up (its file open, aggregators, collective metadata) costs a
// small checkpoint a good part of its time and gives a single writer nothing. collective_transfer() then gives the
// default (independent) transfer list, the only one that driver takes.
H5Handle collective_access(MPI_Comm comm) {
  H5Handle access(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  if (communicator_size(comm) > 1) {
    HPCTRAIN_H5_CHECK(H5Pset_fapl_mpio(access.get(), comm, MPI_INFO_NULL));
    HPCTRAIN_H5_CHECK(H5Pset_all_coll_metadata_ops(access.get(), true));
    HPCTRAIN_H5_CHECK(H5Pset_coll_metadata_write(access.get(), true));
  }
  HPCTRAIN_H5_CHECK(H5Pset_file_locking(access.get(), false, true));
  return access;
}
}  // namespace

H5Handle create_file_collectively(const std::string& path, MPI_Comm comm) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  H5Handle access = collective_access(comm);
  return H5Handle(HPCTRAIN_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get())));
}

H5Handle open_file_collectively(const std::string& path, MPI_Comm comm) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  H5Handle access = collective_access(comm);
  return H5Handle(HPCTRAIN_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get())));
}

H5Handle collective_transfer(MPI_Comm comm) {
  const auto lock = lock_hdf5();
  H5Handle transfer(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  if (communicator_size(comm) > 1) HPCTRAIN_H5_CHECK(H5Pset_dxpl_mpio(transfer.get(), H5FD_MPIO_COLLECTIVE));
  return transfer;
}

H5Handle open_dataset(hid_t location, const std::string& path) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  return H5Handle(HPCTRAIN_H5_CHECK(H5Dopen2(location, path.c_str(), H5P_DEFAULT)));
}

bool link_exists(hid_t location, const std::string& path) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  std::vector<std::string> components;
  for (std::size_t start = 0; start < path.size();) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) components.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  // Ask one level at a time: H5Lexists fails (rather than answering false) when an intermediate group is missing.
  std::string prefix = path.starts_with('/') ? "/" : "";
  for (std::size_t i = 0; i < components.size(); ++i) {
    if (i > 0) {
      H5Handle parent(HPCTRAIN_H5_CHECK(H5Oopen(location, prefix.c_str(), H5P_DEFAULT)));
      if (HPCTRAIN_H5_CHECK(H5Iget_type(parent.get())) != H5I_GROUP) return false;
      prefix += '/';
    }
    prefix += components[i];
    if (HPCTRAIN_H5_CHECK(H5Lexists(location, prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
    // A soft link may dangle: the link exists but the object does not.
    if (HPCTRAIN_H5_CHECK(H5Oexists_by_name(location, prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
  }
  return true;  // an empty path or "/" names the location itself
}

namespace {
struct DatasetVisit {
  std::vector<std::string> paths;
};

// Called from inside HDF5: must not throw. A negative return stops the visit and makes H5Lvisit fail.
herr_t visit_link(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  if (info->type != H5L_TYPE_HARD) return 0;
  const hid_t object = H5Oopen(group, name, H5P_DEFAULT);
  if (object < 0) return -1;
  const bool is_dataset = H5Iget_type(object) == H5I_DATASET;
  if (H5Oclose(object) < 0) return -1;
  if (is_dataset) static_cast<DatasetVisit*>(data)->paths.push_back(std::string("/") + name);
  return 0;
}

herr_t visit_attribute(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_datasets(hid_t file) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  DatasetVisit visit;
  HPCTRAIN_H5_CHECK(H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit_link, &visit));
  return visit.paths;
}

// --- attributes ---

bool attribute_exists(hid_t object, const std::string& name) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  return HPCTRAIN_H5_CHECK(H5Aexists(object, name.c_str())) > 0;
}

std::vector<std::string> attribute_names(hid_t object) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  std::vector<std::string> names;
  hsize_t position = 0;
  HPCTRAIN_H5_CHECK(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &position, visit_attribute, &names));
  return names;
}

std::string read_string_attribute(hid_t object, const std::string& name) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  H5Handle attribute = open_attribute(object, name);
  H5Handle stored_type(HPCTRAIN_H5_CHECK(H5Aget_type(attribute.get())));
  HPCTRAIN_VERIFY(HPCTRAIN_H5_CHECK(H5Tget_class(stored_type.get())) == H5T_STRING, InputError,
                  "attribute '" << name << "' holds " << type_name(stored_type.get()) << ", not a string");
  HPCTRAIN_VERIFY(attribute_point_count(attribute.get()) == 1, InputError,
                  "attribute '" << name << "' holds several strings, expected one");
  if (HPCTRAIN_H5_CHECK(H5Tis_variable_str(stored_type.get())) > 0) {
    H5Handle memory_type = variable_string_type();
    char* text = nullptr;
    HPCTRAIN_H5_CHECK(H5Aread(attribute.get(), memory_type.get(), &text));
    std::string value = text != nullptr ? text : "";
    HPCTRAIN_H5_CHECK(H5free_memory(text));
    return value;
  }
  const std::size_t size = H5Tget_size(stored_type.get());
  H5Handle memory_type(HPCTRAIN_H5_CHECK(H5Tcopy(H5T_C_S1)));
  HPCTRAIN_H5_CHECK(H5Tset_size(memory_type.get(), size + 1));  // room for the terminator HDF5 adds
  std::string buffer(size + 1, '\0');
  HPCTRAIN_H5_CHECK(H5Aread(attribute.get(), memory_type.get(), buffer.data()));
  buffer.resize(buffer.find('\0') == std::string::npos ? buffer.size() : buffer.find('\0'));
  return buffer;
}

double read_number_attribute(hid_t object, const std::string& name) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  H5Handle attribute = open_attribute(object, name);
  H5Handle stored_type(HPCTRAIN_H5_CHECK(H5Aget_type(attribute.get())));
  const H5T_class_t type_class = HPCTRAIN_H5_CHECK(H5Tget_class(stored_type.get()));
  HPCTRAIN_VERIFY(type_class == H5T_INTEGER || type_class == H5T_FLOAT, InputError,
                  "attribute '" << name << "' holds " << type_name(stored_type.get()) << ", not a number");
  HPCTRAIN_VERIFY(attribute_point_count(attribute.get()) == 1, InputError,
                  "attribute '" << name << "' holds several numbers, expected one");
  double value = 0;
  HPCTRAIN_H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &value));
  return value;
}

std::string attribute_as_text(hid_t object, const std::string& name) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  H5Handle attribute = open_attribute(object, name);
  H5Handle stored_type(HPCTRAIN_H5_CHECK(H5Aget_type(attribute.get())));
  const H5T_class_t type_class = HPCTRAIN_H5_CHECK(H5Tget_class(stored_type.get()));
  const std::int64_t count = attribute_point_count(attribute.get());
  constexpr std::int64_t shown_at_most = 16;  // longer arrays are summarised, not printed
  std::ostringstream text;  // (a stream, not "x" + string + "x": GCC 12's -Wrestrict misfires on those)
  if (type_class == H5T_STRING && count == 1) {
    text << '"' << read_string_attribute(object, name) << '"';
    return text.str();
  }
  if ((type_class != H5T_INTEGER && type_class != H5T_FLOAT) || count > shown_at_most || count < 1) {
    text << '<' << count << " x " << type_name(stored_type.get()) << '>';
    return text.str();
  }
  if (count > 1) text << "[";
  if (type_class == H5T_INTEGER && HPCTRAIN_H5_CHECK(H5Tget_sign(stored_type.get())) == H5T_SGN_NONE) {
    std::vector<std::uint64_t> values(static_cast<std::size_t>(count));
    HPCTRAIN_H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_UINT64, values.data()));
    for (std::size_t i = 0; i < values.size(); ++i) text << (i > 0 ? ", " : "") << values[i];
  } else if (type_class == H5T_INTEGER) {
    std::vector<std::int64_t> values(static_cast<std::size_t>(count));
    HPCTRAIN_H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_INT64, values.data()));
    for (std::size_t i = 0; i < values.size(); ++i) text << (i > 0 ? ", " : "") << values[i];
  } else {
    std::vector<double> values(static_cast<std::size_t>(count));
    HPCTRAIN_H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, values.data()));
    for (std::size_t i = 0; i < values.size(); ++i) text << (i > 0 ? ", " : "") << shortest_number_text(values[i]);
  }
  if (count > 1) text << "]";
  return text.str();
}

void write_string_attribute(hid_t object, const std::string& name, const std::string& value) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  H5Handle type = variable_string_type();
  const char* text = value.c_str();
  write_attribute_bytes(object, name, type.get(), type.get(), &text);
}

void write_integer_attribute(hid_t object, const std::string& name, std::int64_t value) {
  const auto lock = lock_hdf5();
  write_attribute_bytes(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_float_attribute(hid_t object, const std::string& name, double value) {
  const auto lock = lock_hdf5();
  write_attribute_bytes(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

// --- descriptions ---

std::vector<std::int64_t> dataspace_shape(hid_t dataspace) {
  const auto lock = lock_hdf5();
  const int rank = HPCTRAIN_H5_CHECK(H5Sget_simple_extent_ndims(dataspace));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) HPCTRAIN_H5_CHECK(H5Sget_simple_extent_dims(dataspace, dims.data(), nullptr));
  return std::vector<std::int64_t>(dims.begin(), dims.end());
}

std::string type_name(hid_t datatype) {
  const auto lock = lock_hdf5();
  const H5T_class_t type_class = HPCTRAIN_H5_CHECK(H5Tget_class(datatype));
  const std::size_t bits = H5Tget_size(datatype) * 8;
  std::string name;
  switch (type_class) {
    case H5T_INTEGER:
      name = (HPCTRAIN_H5_CHECK(H5Tget_sign(datatype)) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
      break;
    case H5T_FLOAT: {
      std::size_t sign_position = 0, exponent_position = 0, exponent_size = 0, mantissa_position = 0, mantissa_size = 0;
      HPCTRAIN_H5_CHECK(H5Tget_fields(datatype, &sign_position, &exponent_position, &exponent_size, &mantissa_position,
                                      &mantissa_size));
      name = bits == 16 && exponent_size == 8 ? "bfloat16" : "float" + std::to_string(bits);
      break;
    }
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    case H5T_VLEN:
      return "variable-length";
    case H5T_TIME:
      return "time";
    default:
      return "unknown";
  }
  if (bits > 8 && HPCTRAIN_H5_CHECK(H5Tget_order(datatype)) == H5T_ORDER_BE) name += " (big-endian)";
  return name;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return text + ")";
}

bool addresses_are_file_offsets(hid_t file) {
  const H5Handle creation(H5Fget_create_plist(file));
  hsize_t user_block = 0;
  return creation.valid() && H5Pget_userblock(creation.get(), &user_block) >= 0 && user_block == 0;
}

std::string storage_description(hid_t dataset) {
  const auto lock = lock_hdf5();
  silence_hdf5_error_printing();
  H5Handle creation(HPCTRAIN_H5_CHECK(H5Dget_create_plist(dataset)));
  const H5D_layout_t layout = HPCTRAIN_H5_CHECK(H5Pget_layout(creation.get()));
  if (layout == H5D_CONTIGUOUS) return "contiguous";
  if (layout == H5D_COMPACT) return "compact";
  if (layout == H5D_VIRTUAL) return "virtual";
  if (layout != H5D_CHUNKED) return "unknown layout";

  hsize_t chunk[H5S_MAX_RANK] = {};
  const int rank = HPCTRAIN_H5_CHECK(H5Pget_chunk(creation.get(), H5S_MAX_RANK, chunk));
  std::string text = "chunks " + shape_text(std::vector<std::int64_t>(chunk, chunk + rank));
  const int filters = HPCTRAIN_H5_CHECK(H5Pget_nfilters(creation.get()));
  if (filters == 0) return text + ", uncompressed";
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, filter_config = 0;
    std::size_t value_count = 8;
    unsigned values[8] = {};
    char name[64] = {};
    const H5Z_filter_t filter = HPCTRAIN_H5_CHECK(H5Pget_filter2(
        creation.get(), static_cast<unsigned>(i), &flags, &value_count, values, sizeof(name), name, &filter_config));
    text += ", ";
    switch (filter) {
      case H5Z_FILTER_DEFLATE:
        text += "gzip level " + std::to_string(value_count > 0 ? values[0] : 0);
        break;
      case H5Z_FILTER_SHUFFLE:
        text += "shuffle";
        break;
      case H5Z_FILTER_FLETCHER32:
        text += "fletcher32";
        break;
      case H5Z_FILTER_SZIP:
        text += "szip";
        break;
      case H5Z_FILTER_NBIT:
        text += "nbit";
        break;
      case H5Z_FILTER_SCALEOFFSET:
        text += "scale-offset";
        break;
      default:
        text += name[0] != '\0' ? std::string(name) : "filter " + std::to_string(filter);
        break;
    }
  }
  return text;
}

}  // namespace hpctrain
