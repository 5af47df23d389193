// Row reads from one HDF5 dataset: straight from a memory map of the file where the layout allows, otherwise hyperslab
// selections of exactly the requested rows with type conversion by HDF5.
#include "hpctrain/data/hdf5_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <csetjmp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>

#include "hpctrain/core/copy_bytes.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/half.hpp"

namespace hpctrain {

namespace {

// --- reads from a memory map that fail gracefully ---
// A mapped file truncated by someone else raises SIGBUS on the next touch of a page past its new end. The direct
// reader copies from the map inside a guard: SIGBUS there jumps back to the guard, which reports the file; a SIGBUS
// anywhere else keeps its default action. The guard is on every read, so it is cheap: sigsetjmp saves no signal mask
// (that would be a sigprocmask system call per read) and the handler runs with SA_NODEFER, so SIGBUS is not left
// blocked when it jumps out.
thread_local sigjmp_buf* mapped_read_jump = nullptr;  // set while this thread copies from a map

extern "C" void on_bus_error(int signal_number, siginfo_t*, void*) {
  if (mapped_read_jump != nullptr) siglongjmp(*mapped_read_jump, 1);
  std::signal(signal_number, SIG_DFL);  // not a guarded read: the default action (core dump) as before
  std::raise(signal_number);
}

void install_bus_error_handler() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction action {};
  action.sa_sigaction = on_bus_error;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  HPCTRAIN_VERIFY(sigaction(SIGBUS, &action, nullptr) == 0, Error, "sigaction(SIGBUS) failed");
}

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

// --- the direct path ---

// Element types the direct path converts itself: little-endian, no padding bits, IEEE floats.
enum class StoredKind { u8, i8, u16, i16, u32, i32, u64, i64, f16, f32, f64 };

std::optional<StoredKind> direct_kind(hid_t type) {
  const H5T_class_t type_class = H5Tget_class(type);
  const std::size_t bytes = H5Tget_size(type);
  if (type_class != H5T_INTEGER && type_class != H5T_FLOAT) return std::nullopt;
  if (H5Tget_precision(type) != bytes * 8 || H5Tget_offset(type) != 0) return std::nullopt;
  if (bytes > 1 && H5Tget_order(type) != H5T_ORDER_LE) return std::nullopt;
  if (type_class == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    switch (bytes) {
      case 1:
        return is_signed ? StoredKind::i8 : StoredKind::u8;
      case 2:
        return is_signed ? StoredKind::i16 : StoredKind::u16;
      case 4:
        return is_signed ? StoredKind::i32 : StoredKind::u32;
      case 8:
        return is_signed ? StoredKind::i64 : StoredKind::u64;
      default:
        return std::nullopt;
    }
  }
  std::size_t sign = 0, exponent_position = 0, exponent_bits = 0, mantissa_position = 0, mantissa_bits = 0;
  if (H5Tget_fields(type, &sign, &exponent_position, &exponent_bits, &mantissa_position, &mantissa_bits) < 0)
    return std::nullopt;
  const std::size_t bias = H5Tget_ebias(type);
  if (bytes == 2 && sign == 15 && exponent_position == 10 && exponent_bits == 5 && mantissa_bits == 10 && bias == 15)
    return StoredKind::f16;
  if (bytes == 4 && sign == 31 && exponent_position == 23 && exponent_bits == 8 && mantissa_bits == 23 && bias == 127)
    return StoredKind::f32;
  if (bytes == 8 && sign == 63 && exponent_position == 52 && exponent_bits == 11 && mantissa_bits == 52 && bias == 1023)
    return StoredKind::f64;
  return std::nullopt;
}

bool is_integer(StoredKind kind) {
  return kind != StoredKind::f16 && kind != StoredKind::f32 && kind != StoredKind::f64;
}

template <class Stored>
Stored load(const unsigned char* bytes) {
  Stored value;
  std::memcpy(&value, bytes, sizeof value);  // rows need not be aligned in the file
  return value;
}

// HDF5's conversions saturate integers that do not fit; so do we.
template <class Out, class Value>
Out convert_value(Value value) {
  if constexpr (std::is_same_v<Out, std::int32_t> && std::is_integral_v<Value>) {
    if constexpr (std::is_signed_v<Value>) {
      return static_cast<std::int32_t>(std::clamp<std::int64_t>(value, INT32_MIN, INT32_MAX));
    } else {
      return static_cast<std::int32_t>(std::min<std::uint64_t>(value, INT32_MAX));
    }
  } else {
    return static_cast<Out>(value);
  }
}

template <class Stored, class Out>
void convert_values(const unsigned char* from, std::int64_t count, Out* to) {
  if constexpr (std::is_same_v<Stored, Out>) {
    copy_bytes(to, from, static_cast<std::size_t>(count) * sizeof(Out));
  } else {
    for (std::int64_t i = 0; i < count; ++i)
      to[i] = convert_value<Out>(load<Stored>(from + static_cast<std::size_t>(i) * sizeof(Stored)));
  }
}

}  // namespace

struct Hdf5Dataset::DirectReader {
  int descriptor = -1;
  void* mapping = MAP_FAILED;
  std::size_t mapped_bytes = 0;
  std::vector<std::uint64_t> chunk_offsets;  // byte offset in the file of each chunk's first row
  std::int64_t rows_per_chunk = 1, values_per_row = 0;
  std::size_t row_bytes = 0;
  StoredKind kind = StoredKind::f32;
  std::uint64_t last_page = 0;  // offset of the map's last page: reads that reach it check the file's size
  RowPrefetch prefetch{1};      // for scattered reads (core/copy_bytes.hpp)

  ~DirectReader() {
    if (mapping != MAP_FAILED) munmap(mapping, mapped_bytes);
    if (descriptor >= 0) close(descriptor);
  }
  [[nodiscard]] const unsigned char* row(std::int64_t r) const {
    return static_cast<const unsigned char*>(mapping) + chunk_offsets[static_cast<std::size_t>(r / rows_per_chunk)] +
           static_cast<std::size_t>(r % rows_per_chunk) * row_bytes;
  }
  // Rows from r on that lie one after the other in the file: up to the end of r's chunk.
  [[nodiscard]] std::int64_t rows_in_chunk_from(std::int64_t r) const { return rows_per_chunk - r % rows_per_chunk; }
  [[nodiscard]] std::uint64_t end_of(const unsigned char* from, std::int64_t rows) const {
    return static_cast<std::uint64_t>(from - static_cast<const unsigned char*>(mapping)) +
           static_cast<std::uint64_t>(rows) * row_bytes;
  }

  // Calls copy(i, first row, rows) for each run of consecutive rows of indices[0..count) within one chunk; returns the
  // end (file offset) of the highest byte copied. A random row is a cache miss (and a TLB miss) the copy would wait
  // for: the rows after the current run are prefetched about 8 KiB ahead, so their loads overlap the copy.
  template <class Copy>
  std::uint64_t for_each_run(const std::int64_t* indices, std::int64_t count, Copy&& copy) const {
    std::uint64_t end = 0;
    std::int64_t ahead = 0;  // indices before this one have been prefetched, or copied
    for (std::int64_t i = 0; i < count;) {
      const std::int64_t first = indices[i];
      const std::int64_t limit = std::min(count - i, rows_in_chunk_from(first));
      std::int64_t run = 1;
      while (run < limit && indices[i + run] == first + run) ++run;
      for (ahead = std::max(ahead, i + run); ahead < std::min(count, i + run + prefetch.rows_ahead()); ++ahead)
        prefetch(row(indices[ahead]));
      const unsigned char* from = row(first);
      copy(i, from, run);
      end = std::max(end, end_of(from, run));
      i += run;
    }
    return end;
  }

  template <class Out>
  void convert(const unsigned char* from, std::int64_t values, Out* to) const {
    switch (kind) {
      case StoredKind::u8:
        return convert_values<std::uint8_t>(from, values, to);
      case StoredKind::i8:
        return convert_values<std::int8_t>(from, values, to);
      case StoredKind::u16:
        return convert_values<std::uint16_t>(from, values, to);
      case StoredKind::i16:
        return convert_values<std::int16_t>(from, values, to);
      case StoredKind::u32:
        return convert_values<std::uint32_t>(from, values, to);
      case StoredKind::i32:
        return convert_values<std::int32_t>(from, values, to);
      case StoredKind::u64:
        return convert_values<std::uint64_t>(from, values, to);
      case StoredKind::i64:
        return convert_values<std::int64_t>(from, values, to);
      case StoredKind::f32:
        return convert_values<float>(from, values, to);
      case StoredKind::f64:
        return convert_values<double>(from, values, to);
      case StoredKind::f16:
        for (std::int64_t i = 0; i < values; ++i)
          to[i] = static_cast<Out>(to_float(fp16{load<std::uint16_t>(from + 2 * static_cast<std::size_t>(i))}));
        return;
    }
  }

  // Rows indices[0..count) into out, (count, values_per_row); consecutive rows of one chunk are copied together.
  // Returns the end of the highest byte read, as for_each_run.
  template <class Out>
  std::uint64_t read_rows(const std::int64_t* indices, std::int64_t count, Out* out) const {
    if (stores<Out>()) return copy_rows(indices, count, reinterpret_cast<unsigned char*>(out));
    return for_each_run(indices, count, [&](std::int64_t i, const unsigned char* from, std::int64_t run) {
      convert(from, run * values_per_row, out + i * values_per_row);
    });
  }

  // Whether the values are stored as Out, so that rows are copied byte for byte.
  template <class Out>
  [[nodiscard]] bool stores() const {
    return (std::is_same_v<Out, float> && kind == StoredKind::f32) ||
           (std::is_same_v<Out, std::int32_t> && kind == StoredKind::i32);
  }

  // Rows indices[0..count) into out as stored, byte for byte: (count, row_bytes). A label (4 bytes) is one load and
  // one store, not a call to memcpy.
  std::uint64_t copy_rows(const std::int64_t* indices, std::int64_t count, unsigned char* out) const {
    const auto copy_with = [&](auto&& copy_one) {
      return for_each_run(indices, count, [&](std::int64_t i, const unsigned char* from, std::int64_t run) {
        unsigned char* to = out + static_cast<std::size_t>(i) * row_bytes;
        if (run == 1) return copy_one(to, from);
        copy_bytes(to, from, static_cast<std::size_t>(run) * row_bytes);
      });
    };
    const auto copy_fixed = [&]<std::size_t bytes>() {
      return copy_with([](unsigned char* to, const unsigned char* from) { std::memcpy(to, from, bytes); });
    };
    switch (row_bytes) {
      case 4:
        return copy_fixed.template operator()<4>();
      case 8:
        return copy_fixed.template operator()<8>();
      default:
        return copy_with([&](unsigned char* to, const unsigned char* from) { copy_bytes(to, from, row_bytes); });
    }
  }

  template <class Out>
  std::uint64_t read_range(std::int64_t first, std::int64_t count, Out* out) const {
    std::uint64_t end = 0;
    for (std::int64_t done = 0; done < count;) {
      const std::int64_t run = std::min(count - done, rows_in_chunk_from(first + done));
      const unsigned char* from = row(first + done);
      convert(from, run * values_per_row, out + done * values_per_row);
      end = std::max(end, end_of(from, run));
      done += run;
    }
    return end;
  }
};

// The direct reader for this dataset, or null when HDF5 must read it (see hdf5_dataset.hpp). Caller holds lock_hdf5().
std::unique_ptr<Hdf5Dataset::DirectReader> Hdf5Dataset::make_direct_reader() const {
  const std::string& file_name = file_name_;
  const hid_t file = file_.get(), dataset = dataset_.get(), stored_type = stored_type_.get();
  const std::vector<std::int64_t>& shape = shape_;
  if (const char* setting = std::getenv("HPCTRAIN_HDF5_DIRECT"); setting != nullptr && std::string(setting) == "0")
    return nullptr;  // the escape hatch, and the way to measure HDF5's own path
  const auto kind = direct_kind(stored_type);
  if (!kind || shape.empty() || shape[0] == 0) return nullptr;
  auto reader = std::make_unique<Hdf5Dataset::DirectReader>();
  reader->kind = *kind;
  reader->values_per_row = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) reader->values_per_row *= shape[d];
  reader->row_bytes = static_cast<std::size_t>(reader->values_per_row) * H5Tget_size(stored_type);
  if (reader->row_bytes == 0) return nullptr;

  if (!addresses_are_file_offsets(file)) return nullptr;  // files with a user block are left to HDF5

  const H5Handle creation(H5Dget_create_plist(dataset));
  if (!creation.valid()) return nullptr;
  const H5D_layout_t layout = H5Pget_layout(creation.get());
  const std::int64_t samples = shape[0];
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t address = H5Dget_offset(dataset);  // undefined when external or never written
    if (address == HADDR_UNDEF) return nullptr;
    reader->rows_per_chunk = samples;
    reader->chunk_offsets = {address};
  } else if (layout == H5D_CHUNKED) {
    if (H5Pget_nfilters(creation.get()) != 0) return nullptr;
    std::vector<hsize_t> chunk(shape.size());
    if (H5Pget_chunk(creation.get(), static_cast<int>(chunk.size()), chunk.data()) != static_cast<int>(shape.size()))
      return nullptr;
    for (std::size_t d = 1; d < shape.size(); ++d)
      if (chunk[d] != static_cast<hsize_t>(shape[d])) return nullptr;  // a chunk must hold whole samples
    reader->rows_per_chunk = static_cast<std::int64_t>(chunk[0]);
    const std::int64_t chunks = (samples + reader->rows_per_chunk - 1) / reader->rows_per_chunk;
    std::vector<hsize_t> offset(shape.size(), 0);
    for (std::int64_t c = 0; c < chunks; ++c) {
      offset[0] = static_cast<hsize_t>(c * reader->rows_per_chunk);
      unsigned filter_mask = 0;
      haddr_t address = HADDR_UNDEF;
      hsize_t bytes = 0;
      if (H5Dget_chunk_info_by_coord(dataset, offset.data(), &filter_mask, &address, &bytes) < 0 ||
          address == HADDR_UNDEF || bytes != static_cast<hsize_t>(reader->rows_per_chunk) * reader->row_bytes) {
        H5Eclear2(H5E_DEFAULT);
        return nullptr;  // a chunk never written (HDF5 supplies fill values) or an unexpected size
      }
      reader->chunk_offsets.push_back(address);
    }
  } else {
    return nullptr;  // compact or virtual: small or spread over files, HDF5 handles them
  }

  reader->descriptor = open(file_name.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat status {};
  if (reader->descriptor < 0 || fstat(reader->descriptor, &status) != 0) return nullptr;
  reader->mapped_bytes = static_cast<std::size_t>(status.st_size);
  const std::uint64_t chunk_span = static_cast<std::uint64_t>(reader->rows_per_chunk) * reader->row_bytes;
  for (const std::uint64_t chunk_offset : reader->chunk_offsets)  // every byte we may touch lies inside the file
    if (chunk_offset + chunk_span > reader->mapped_bytes) return nullptr;
  reader->mapping = mmap(nullptr, reader->mapped_bytes, PROT_READ, MAP_SHARED, reader->descriptor, 0);
  if (reader->mapping == MAP_FAILED) return nullptr;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  reader->last_page = (reader->mapped_bytes - 1) / page * page;  // mapped_bytes > 0: the chunks lie inside
  reader->prefetch = RowPrefetch(reader->row_bytes);
  return reader;
}

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
  // The chunk cache. A compressed chunk must be read and inflated whole, so for filtered data a cache far above HDF5's
  // default 1 MiB keeps a dataset of modest size in memory after the first epoch, instead of inflating a whole chunk
  // again for every random row. Unfiltered chunks are better read without it: HDF5 then reads just the selected rows
  // from the file (through the page cache) instead of copying every touched chunk whole into the cache first, which
  // for random rows of a file larger than the cache costs a chunk (256 KiB - 1 MiB) per row.
  bool filtered = false;
  {
    const H5Handle probe(HPCTRAIN_H5_CHECK(H5Dopen2(file_.get(), dataset_path_.c_str(), H5P_DEFAULT)));
    const H5Handle creation(HPCTRAIN_H5_CHECK(H5Dget_create_plist(probe.get())));
    filtered = HPCTRAIN_H5_CHECK(H5Pget_nfilters(creation.get())) > 0;
  }
  H5Handle access(HPCTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)));
  HPCTRAIN_H5_CHECK(H5Pset_chunk_cache(access.get(), filtered ? chunk_cache_slots : 0, filtered ? chunk_cache_bytes : 0,
                                       H5D_CHUNK_CACHE_W0_DEFAULT));
  dataset_ = H5Handle(HPCTRAIN_H5_CHECK(H5Dopen2(file_.get(), dataset_path_.c_str(), access.get())));

  file_space_ = H5Handle(HPCTRAIN_H5_CHECK(H5Dget_space(dataset_.get())));
  shape_ = dataspace_shape(file_space_.get());
  HPCTRAIN_VERIFY(!shape_.empty(), InputError,
                  "dataset " << where << " is a single value; expected one row per sample (at least one dimension)");
  for (std::size_t d = 1; d < shape_.size(); ++d) sample_size_ *= shape_[d];

  H5Handle stored_type(HPCTRAIN_H5_CHECK(H5Dget_type(dataset_.get())));
  type_name_ = hpctrain::type_name(stored_type.get());
  const H5T_class_t type_class = HPCTRAIN_H5_CHECK(H5Tget_class(stored_type.get()));
  HPCTRAIN_VERIFY(
      type_class == H5T_INTEGER || type_class == H5T_FLOAT, InputError,
      "dataset " << where << " holds " << type_name_ << " values; expected integers or floating point",
      "store numbers: signed or unsigned integers of 8 to 64 bits, or float16, float32 or float64 (converted to "
      "float32 on load; docs/data.md#element-types); "
      "'hpctrain data convert' writes such files from .npy or CSV");
  stores_integers_ = type_class == H5T_INTEGER;
  stored_type_ = std::move(stored_type);
  stored_value_bytes_ = H5Tget_size(stored_type_.get());
  direct_ = make_direct_reader();
  file_bytes_ = file_size_now();
}

Hdf5Dataset::~Hdf5Dataset() = default;

std::uintmax_t Hdf5Dataset::file_size_now() const {
  struct stat status {};  // the direct path asks about the file it mapped, which a rename over its name leaves intact
  const int result = direct_ ? fstat(direct_->descriptor, &status) : stat(file_name_.c_str(), &status);
  return result == 0 ? static_cast<std::uintmax_t>(status.st_size) : 0;
}

std::optional<PageMapping> Hdf5Dataset::map_pages() const {
  if (!direct_) return std::nullopt;
  return page_mapping(direct_->mapping);
}

void Hdf5Dataset::check_file_intact() const {
  const std::uintmax_t now = file_size_now();
  if (now >= file_bytes_) return;
  throw InputError("data file '" + file_name_ + "' shrank from " + std::to_string(file_bytes_) + " to " +
                       std::to_string(now) + " bytes while hpctrain was reading '" + dataset_path_ +
                       "' (truncated, or rewritten in place); rows read from it now would be wrong",
                   "do not change data files during a run: restore the file, then continue with --resume auto",
                   ErrorScope::this_rank);
}

// A file that shrank is caught without a system call per read: truncation removes the pages past the new end from the
// map, so touching the map's last byte after the copy raises SIGBUS whenever the last page went. A shrink that leaves
// part of the last page reads as zeros there instead, so a read that reached the last page asks the file's size
// (fstat); rows outside it are unchanged by such a shrink and read on.
template <class Copy>
void Hdf5Dataset::read_mapped(Copy&& copy) const {
  install_bus_error_handler();
  sigjmp_buf jump;
  sigjmp_buf* const outer = mapped_read_jump;
  if (sigsetjmp(jump, 0) != 0) {  // SIGBUS inside copy() or the touch: the file lost pages we mapped
    mapped_read_jump = outer;
    check_file_intact();
    throw InputError("data file '" + file_name_ + "' could not be read (bus error on its memory map)",
                     "check the file system; restore the file and continue with --resume auto", ErrorScope::this_rank);
  }
  mapped_read_jump = &jump;
  // The fences keep the compiler from moving reads of the map (inlined loops now, not a call) out of the guard.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const std::uint64_t end = copy();
  [[maybe_unused]] const unsigned char last =
      static_cast<const volatile unsigned char*>(direct_->mapping)[direct_->mapped_bytes - 1];
  std::atomic_signal_fence(std::memory_order_seq_cst);
  mapped_read_jump = outer;
  if (end > direct_->last_page) check_file_intact();
}

namespace {
void check_rows(const std::int64_t* indices, std::int64_t count, std::int64_t samples, const std::string& path,
                const std::string& file) {
  HPCTRAIN_ASSERT(count >= 0, "negative row count " << count);
  for (std::int64_t i = 0; i < count; ++i)
    HPCTRAIN_ASSERT(indices[i] >= 0 && indices[i] < samples, "row " << indices[i] << " is outside [0, " << samples
                                                                    << ") of '" << path << "' in '" << file << "'");
}
}  // namespace

void Hdf5Dataset::read_rows(const std::int64_t* indices, std::int64_t count, float* out) {
  if (direct_) {
    check_rows(indices, count, samples(), dataset_path_, file_name_);
    read_mapped([&] { return direct_->read_rows(indices, count, out); });
    return;
  }
  const auto lock = lock_hdf5();  // taken before H5T_NATIVE_*, which are HDF5 calls too
  read_rows_as(H5T_NATIVE_FLOAT, sizeof(float), indices, count, out);
  check_file_intact();  // HDF5 reads past the end of a truncated file as zeros
}

void Hdf5Dataset::read_rows(const std::int64_t* indices, std::int64_t count, std::int32_t* out) {
  if (direct_ && is_integer(direct_->kind)) {  // float -> integer rounding is left to HDF5's rules
    check_rows(indices, count, samples(), dataset_path_, file_name_);
    read_mapped([&] { return direct_->read_rows(indices, count, out); });
    return;
  }
  const auto lock = lock_hdf5();
  read_rows_as(H5T_NATIVE_INT32, sizeof(std::int32_t), indices, count, out);
  check_file_intact();
}

void Hdf5Dataset::read_range(std::int64_t first, std::int64_t count, float* out) {
  if (direct_) {
    HPCTRAIN_ASSERT(first >= 0 && count >= 0 && first + count <= samples(), "rows outside the dataset");
    read_mapped([&] { return direct_->read_range(first, count, out); });
    return;
  }
  const auto lock = lock_hdf5();
  read_range_as(H5T_NATIVE_FLOAT, first, count, out);
  check_file_intact();
}

void Hdf5Dataset::read_range(std::int64_t first, std::int64_t count, std::int32_t* out) {
  if (direct_ && is_integer(direct_->kind)) {
    HPCTRAIN_ASSERT(first >= 0 && count >= 0 && first + count <= samples(), "rows outside the dataset");
    read_mapped([&] { return direct_->read_range(first, count, out); });
    return;
  }
  const auto lock = lock_hdf5();
  read_range_as(H5T_NATIVE_INT32, first, count, out);
  check_file_intact();
}

void Hdf5Dataset::read_range(std::int64_t first, std::int64_t count, double* out) {
  if (direct_) {
    HPCTRAIN_ASSERT(first >= 0 && count >= 0 && first + count <= samples(), "rows outside the dataset");
    read_mapped([&] { return direct_->read_range(first, count, out); });
    return;
  }
  const auto lock = lock_hdf5();
  read_range_as(H5T_NATIVE_DOUBLE, first, count, out);
  check_file_intact();
}

void Hdf5Dataset::read_rows_stored(const std::int64_t* indices, std::int64_t count, void* out) {
  if (direct_) {
    check_rows(indices, count, samples(), dataset_path_, file_name_);
    read_mapped([&] { return direct_->copy_rows(indices, count, static_cast<unsigned char*>(out)); });
    return;
  }
  const auto lock = lock_hdf5();
  read_rows_as(stored_type_.get(), stored_value_bytes_, indices, count, out);
  check_file_intact();
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
    copy_bytes(destination + static_cast<std::size_t>(i) * row_bytes,
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
