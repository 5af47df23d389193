// The thin HDF5 layer everything else goes through: an owning handle that closes itself, opening and creating files
// with user-facing error messages, dataset and link look-ups, attributes, and names for stored types.
//
// Every HDF5 call in hpctrain is wrapped in HPCTRAIN_H5_CHECK, which turns a failure into a LibraryError carrying the
// HDF5 error stack. HDF5's own printing of that stack to stderr is switched off by silence_hdf5_error_printing(), which
// every helper here calls first, so a failure is reported once, by our error path, and not also as a wall of text.
//
// The HDF5 we build against is not thread-safe, yet a run uses it from two threads (the data loader's background thread
// reads while the main thread appends metrics or writes a checkpoint). Everything here, in Hdf5Dataset and in
// MetricsWriter takes lock_hdf5(); other code that calls HDF5 directly while another thread may use it must too.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace hpctrain {

// The process-wide lock around HDF5 calls; recursive, so a helper may call another helper while holding it.
[[nodiscard]] std::unique_lock<std::recursive_mutex> lock_hdf5();

// Owns one HDF5 identifier (file, group, dataset, dataspace, datatype, attribute or property list) and closes it with
// the matching H5*close. Movable, not copyable. Never wrap a predefined identifier such as H5T_NATIVE_FLOAT or
// H5P_DEFAULT.
class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) : id_(id) {}
  // A failed close is logged to stderr, never thrown; not logged while an exception unwinds the stack (the failure that
  // threw it is reported, and a close after a failed write fails too: its warning would only repeat it).
  ~H5Handle();
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& other) noexcept : id_(other.release()) {}
  H5Handle& operator=(H5Handle&& other) noexcept;

  [[nodiscard]] hid_t get() const { return id_; }
  [[nodiscard]] bool valid() const { return id_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives up ownership without closing.
  hid_t release();
  // Closes now and throws LibraryError on failure: use it where a failed close means lost data (a file being written).
  void close();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Switches off HDF5's automatic printing of its error stack (for the calling thread; our build is not thread-safe, so
// that is the whole process). Idempotent and cheap.
void silence_hdf5_error_printing();

// Opens an existing file read-only. `description` names the file in messages ("data file", "checkpoint"). Throws
// InputError when the file is missing, unreadable, not HDF5 or damaged.
H5Handle open_file_read_only(const std::string& path, std::string_view description = "file");

// Creates a file, truncating any existing one. File locking is off so that a reader (a live plot, h5dump) can open a
// file that a running job is still appending to.
H5Handle create_file(const std::string& path);

// Data files for random row reads (what `hpctrain data generate/convert/split` write). Linux's page cache holds a file
// in folios of up to 2 MiB where the file system allows (ext4 from Linux 6.16, xfs), sized by the writes that filled
// it, and maps a read-only map 2 MiB at a time wherever a whole 2 MiB folio sits on a 2 MiB boundary: random rows then
// cost no page fault and no TLB miss each (docs/data.md, "Direct reads"). So a data file is written in pieces of whole
// 2 MiB at 2 MiB offsets: create_data_file is create_file with every object of 64 MiB or more placed on a 2 MiB
// boundary (at most 2 MiB of padding each, 3% or less), row_dataset_layout lays a dataset out as one preallocated
// extent, and writers write blocks of folio_block_rows rows.
inline constexpr std::int64_t large_folio_bytes = std::int64_t{2} << 20;
inline constexpr std::int64_t aligned_object_bytes = std::int64_t{64} << 20;
H5Handle create_data_file(const std::string& path);
// A dataset creation list for a fixed-size, uncompressed dataset of rows: contiguous, its space allocated when the
// dataset is created (so nothing HDF5 writes later lands inside it) and no fill values written (the writer fills it;
// writing fill values first would leave the page cache in the fill writes' small folios).
H5Handle row_dataset_layout();
// Rows per write block for rows of `row_bytes` bytes and blocks of at most `most_bytes` (at least one row): the most
// rows whose bytes are a whole number of 2 MiB pieces when such a count fits, otherwise the most that fit.
std::int64_t folio_block_rows(std::int64_t row_bytes, std::int64_t most_bytes);

// Files all ranks open together through the MPI-IO driver, for collective reads and writes (parallel HDF5). Collective:
// every rank passes the same path. Metadata is read and written collectively; file locking is off (not every parallel
// file system has it). A communicator of one process gets the POSIX driver instead. Both throw LibraryError.
H5Handle create_file_collectively(const std::string& path, MPI_Comm comm);  // truncates an existing file
H5Handle open_file_collectively(const std::string& path, MPI_Comm comm);    // read-only

// A dataset transfer property list for collective I/O on a file of create/open_file_collectively(comm): every rank
// takes part in each H5Dread / H5Dwrite (the default list for a communicator of one process, whose file uses the
// POSIX driver).
H5Handle collective_transfer(MPI_Comm comm);

// Opens a dataset; throws LibraryError when it does not exist (check with link_exists first for a friendly message).
H5Handle open_dataset(hid_t location, const std::string& path);

// Whether every component of "/a/b/c" exists and every component but the last is a group. Never throws for a missing
// intermediate group, unlike H5Lexists on the full path.
bool link_exists(hid_t location, const std::string& path);

// Paths of every dataset below the root, in the order HDF5 visits them ("/features", "/group/values", ...).
std::vector<std::string> list_datasets(hid_t file);

// Attributes on any object (file root, group, dataset).
bool attribute_exists(hid_t object, const std::string& name);
std::vector<std::string> attribute_names(hid_t object);
std::string read_string_attribute(hid_t object, const std::string& name);  // fixed or variable-length strings
double read_number_attribute(hid_t object, const std::string& name);       // any scalar integer or float
std::string attribute_as_text(hid_t object, const std::string& name);      // for display: "\"blobs\"", "42", "[1, 2]"
// Each writer replaces an existing attribute of the same name.
void write_string_attribute(hid_t object, const std::string& name, const std::string& value);
void write_integer_attribute(hid_t object, const std::string& name, std::int64_t value);
void write_float_attribute(hid_t object, const std::string& name, double value);

// Shape of a simple dataspace; {} for a scalar.
std::vector<std::int64_t> dataspace_shape(hid_t dataspace);

// Short name of a stored type: "uint8", "int32", "float16", "float32", "float64", "string", "compound", ...
// Big-endian numbers get " (big-endian)" appended.
std::string type_name(hid_t datatype);

// Whether HDF5's addresses in `file` are byte offsets a POSIX read can use: true for a file without a user block
// (addresses count from its end); false also when HDF5 cannot say. For reads that bypass HDF5 (data, checkpoints).
bool addresses_are_file_offsets(hid_t file);

// Layout of a dataset for display: "contiguous", "chunks (1024, 2)", "chunks (1024) gzip level 4, shuffle", ...
std::string storage_description(hid_t dataset);

// "(1000, 2)" for {1000, 2}; "()" for a scalar.
std::string shape_text(const std::vector<std::int64_t>& shape);

}  // namespace hpctrain
