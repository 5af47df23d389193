// Checkpoint files: flat vectors written as per-rank slices (independent I/O into collectively created datasets), read
// back on any rank count, each dataset checked by its CRC-32.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <optional>
#include <utility>

#include "hpctrain/core/copy_bytes.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/dist/part_exchange.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/io/checkpoint_phases.hpp"
#include "hpctrain/io/crc32.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/io/parallel_file.hpp"

namespace hpctrain {

namespace {

std::vector<hsize_t> dims_of(const std::vector<std::int64_t>& shape) { return {shape.begin(), shape.end()}; }

// This rank's contiguous part [begin, end) of a flat vector of `count` elements.
std::pair<std::int64_t, std::int64_t> part_slice(std::int64_t count, int rank, int ranks) {
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
std::pair<hsize_t, hsize_t> overlap(const FlatTensor& tensor, std::int64_t slice_begin, std::int64_t slice_end) {
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

SliceSelection select_slice(hid_t dataset, const FlatTensor& tensor, std::int64_t slice_begin, std::int64_t slice_end) {
  const auto [first, last] = overlap(tensor, slice_begin, slice_end);
  SliceSelection slice{H5Handle(HPCTRAIN_H5_CHECK(H5Dget_space(dataset))), {}, first};
  HPCTRAIN_H5_CHECK(H5Sselect_none(slice.file.get()));
  std::vector<hsize_t> prefix;
  select_flat_range(slice.file.get(), dims_of(tensor.shape), 0, prefix, first, last);
  const hsize_t elements = std::max<hsize_t>(last - first, 1);
  slice.memory = H5Handle(HPCTRAIN_H5_CHECK(H5Screate_simple(1, &elements, nullptr)));
  if (last == first) HPCTRAIN_H5_CHECK(H5Sselect_none(slice.memory.get()));
  return slice;
}

H5Handle create_dataset(hid_t file, const std::string& path, hid_t type, const std::vector<std::int64_t>& extents) {
  const std::vector<hsize_t> shape = dims_of(extents);
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

// A checksummed part of a tensor: its CRC-32 over `bytes` bytes from element `offset` of the flat vector.
struct ChecksumPiece {
  std::uint64_t tensor, offset, crc, bytes;
};

// The CRC-32 of every whole tensor from the ranks' pieces (every rank passes its own; together they cover each tensor
// once): the pieces are gathered and zlib's crc32_combine joins each tensor's in the order of their offsets. All ranks
// get the same values.
std::vector<std::uint32_t> combine_pieces(const std::vector<ChecksumPiece>& mine, std::size_t tensors,
                                          const MpiEnvironment& mpi) {
  const CheckpointPhaseScope phase(CheckpointPhase::checksum);
  constexpr int fields = 4;
  const int sent = static_cast<int>(mine.size()) * fields;
  std::vector<int> counts(static_cast<std::size_t>(mpi.size())), offsets(counts.size(), 0);
  HPCTRAIN_MPI_CHECK(MPI_Allgather(&sent, 1, MPI_INT, counts.data(), 1, MPI_INT, mpi.world()));
  for (std::size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  std::vector<ChecksumPiece> all(static_cast<std::size_t>(offsets.back() + counts.back()) / fields);
  static_assert(sizeof(ChecksumPiece) == fields * sizeof(std::uint64_t));
  HPCTRAIN_MPI_CHECK(MPI_Allgatherv(mine.data(), sent, MPI_UINT64_T, all.data(), counts.data(), offsets.data(),
                                    MPI_UINT64_T, mpi.world()));
  std::stable_sort(all.begin(), all.end(), [](const ChecksumPiece& a, const ChecksumPiece& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.offset < b.offset;
  });
  std::vector<std::uint32_t> checksums(tensors, 0);
  for (const ChecksumPiece& piece : all)
    if (piece.bytes > 0)
      checksums[piece.tensor] = static_cast<std::uint32_t>(
          crc32_combine(checksums[piece.tensor], static_cast<uLong>(piece.crc), static_cast<z_off_t>(piece.bytes)));
  return checksums;
}

// What a rank reads of a replicated flat vector of `count` elements: [begin, end), of which it checksums
// [checked_begin, checked_end). Where every node runs as many ranks, each rank reads its node's whole slice and
// checksums its own part of it: the node's page cache serves the file once, and a cached read fills memory faster
// than an exchange between the node's ranks does (issue 17: 2 ranks, 100 MB); the nodes' slices are then exchanged
// between the nodes. Otherwise each rank reads and checksums its own slice, and the slices are gathered.
struct ReadShare {
  std::int64_t begin = 0, end = 0, checked_begin = 0, checked_end = 0;
};

ReadShare read_share(std::int64_t count, const MpiEnvironment& mpi) {
  if (!mpi.uniform_nodes()) {
    const auto [begin, end] = part_slice(count, mpi.rank(), mpi.size());
    return {begin, end, begin, end};
  }
  const auto [begin, end] = part_slice(count, mpi.node_index(), mpi.node_count());
  const auto [first, last] = part_slice(end - begin, mpi.local_rank(), mpi.local_size());
  return {begin, end, begin + first, begin + last};
}

// After every rank has read its ReadShare: every rank holds the whole vector.
void gather_shares(float* flat, std::int64_t count, const MpiEnvironment& mpi) {
  const CheckpointPhaseScope phase(CheckpointPhase::gather);
  const bool by_node = mpi.uniform_nodes();
  const int parts = by_node ? mpi.node_count() : mpi.size();
  if (parts == 1) return;
  // By node: among the ranks with this rank's local rank, one per node, ordered by node.
  MPI_Comm peers = mpi.world();
  if (by_node) HPCTRAIN_MPI_CHECK(MPI_Comm_split(mpi.world(), mpi.local_rank(), mpi.node_index(), &peers));
  std::vector<std::int64_t> bounds = {0};
  for (int p = 0; p < parts; ++p) bounds.push_back(part_slice(count, p, parts).second);
  allgather_parts(flat, bounds, peers);  // a failure ends the job: the communicator need not be freed on that path
  if (by_node) HPCTRAIN_MPI_CHECK(MPI_Comm_free(&peers));
}

// The CRC-32 of every whole tensor of a vector, computed in parallel: each rank checksums its parts (disjoint ranges
// of the flat vector; together the ranks' parts cover it).
std::vector<std::uint32_t> tensor_checksums(const std::vector<FlatTensor>& tensors, const float* flat,
                                            const std::vector<ElementRange>& parts, const MpiEnvironment& mpi) {
  std::vector<ChecksumPiece> pieces;
  {
    const CheckpointPhaseScope phase(CheckpointPhase::checksum);
    for (std::size_t t = 0; t < tensors.size(); ++t)
      for (const ElementRange& part : parts) {
        const auto [first, last] = overlap(tensors[t], part.begin, part.end);
        const std::size_t bytes = static_cast<std::size_t>(last - first) * sizeof(float);
        if (bytes == 0) continue;
        const std::int64_t offset = tensors[t].offset + static_cast<std::int64_t>(first);
        pieces.push_back({t, static_cast<std::uint64_t>(offset), crc32_parallel(flat + offset, bytes), bytes});
      }
  }
  return combine_pieces(pieces, tensors.size(), mpi);
}

// Elements a read through HDF5 takes at a time, to checksum them while they are still in the cache (4 MiB).
constexpr std::int64_t read_piece_elements = std::int64_t{1} << 20;

// Pieces of a direct read (1 MiB): small enough that the checksum finds the piece in the core's L2 cache, where the
// kernel's copy left it (data + checksum of a 1 GB read, 1 rank x 2 threads, Intel Xeon: 102 ms against 127 ms with
// 4 MiB pieces, medians of 5), large enough that the system calls do not count.
constexpr std::int64_t direct_piece_elements = std::int64_t{1} << 18;

// Writes go in pieces of 32 MiB, after each of which the kernel is asked to start writing the file's dirty pages to
// the disk (sync_file_range): the disk then writes while the next piece is copied into the page cache, and the
// commit's fsync waits only for the last pieces. Without it the whole file was copied first and then written by the
// fsync (issue 17: the commit was 290-375 ms of a 1 GB checkpoint).
constexpr std::int64_t write_piece_elements = std::int64_t{8} << 20;

// A descriptor this code opened itself, closed when it goes.
struct OwnedDescriptor {
  int value = -1;
  OwnedDescriptor() = default;
  OwnedDescriptor(const OwnedDescriptor&) = delete;
  OwnedDescriptor& operator=(const OwnedDescriptor&) = delete;
  ~OwnedDescriptor() {
    if (value >= 0) ::close(value);
  }
};

// A POSIX descriptor of an open HDF5 file, for direct reads and for starting the write-out: HDF5's own for a single
// process (sec2 driver); under MPI-IO one this rank opens read-only and `opened` keeps (reading needs no more, nor
// does sync_file_range). -1 where the open fails: HDF5 then does all of it.
int posix_descriptor(hid_t file, OwnedDescriptor& opened) {
  H5Handle access(HPCTRAIN_H5_CHECK(H5Fget_access_plist(file)));
  if (HPCTRAIN_H5_CHECK(H5Pget_driver(access.get())) == H5FD_SEC2) {
    void* handle = nullptr;
    HPCTRAIN_H5_CHECK(H5Fget_vfd_handle(file, access.get(), &handle));
    if (handle != nullptr) return *static_cast<int*>(handle);
  }
  const ssize_t length = HPCTRAIN_H5_CHECK(H5Fget_name(file, nullptr, 0));
  std::string name(static_cast<std::size_t>(length), '\0');
  HPCTRAIN_H5_CHECK(H5Fget_name(file, name.data(), name.size() + 1));
  opened.value = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  return opened.value;
}

// Starts the write-out of the file's dirty pages without waiting for it. Its errors are not checked here: a failed
// write-out shows in the commit's fsync, which fails the checkpoint.
void start_writeback(int descriptor) {
  if (descriptor >= 0) (void)sync_file_range(descriptor, 0, 0, SYNC_FILE_RANGE_WRITE);
}

// Where a tensor's values start in its file (whose addresses are file offsets), when they lie there as this host's
// floats: one contiguous, allocated block of little-endian IEEE binary32. Otherwise nothing, and HDF5 reads it.
std::optional<std::uint64_t> raw_float_offset(hid_t dataset, std::int64_t count) {
  if constexpr (std::endian::native != std::endian::little) return std::nullopt;
  const H5Handle creation(HPCTRAIN_H5_CHECK(H5Dget_create_plist(dataset)));
  const H5Handle type(HPCTRAIN_H5_CHECK(H5Dget_type(dataset)));
  if (HPCTRAIN_H5_CHECK(H5Pget_layout(creation.get())) != H5D_CONTIGUOUS ||
      HPCTRAIN_H5_CHECK(H5Tequal(type.get(), H5T_IEEE_F32LE)) <= 0 ||
      H5Dget_storage_size(dataset) != static_cast<hsize_t>(count) * sizeof(float))
    return std::nullopt;
  const haddr_t address = H5Dget_offset(dataset);  // undefined when never written
  if (address == HADDR_UNDEF) return std::nullopt;
  return static_cast<std::uint64_t>(address);
}

// Reads `count` floats at byte `offset` of a POSIX file into `values`, in pieces spread over the OpenMP threads, each
// checksummed while it is still in the cache as far as it lies in [checked_begin, checked_end) of `values`; returns
// the CRC-32 of that range (the pieces' CRCs combined in order).
// A read from the page cache is a copy the kernel makes on the calling thread: one thread reached about half of a
// cached dd, whose 4 MiB buffer stays in the cache while these values go to memory (issue 17).
std::uint32_t read_raw_floats(int descriptor, std::uint64_t offset, float* values, std::int64_t count,
                              std::int64_t checked_begin, std::int64_t checked_end, const std::string& file,
                              const std::string& tensor) {
  // The part of piece `piece` to checksum, in elements of `values`.
  const auto checked = [&](std::int64_t piece) {
    const std::int64_t first = std::max(piece * direct_piece_elements, checked_begin);
    return std::pair{first, std::max(first, std::min((piece + 1) * direct_piece_elements, checked_end))};
  };
  const std::int64_t pieces = (count + direct_piece_elements - 1) / direct_piece_elements;
  std::vector<std::uint32_t> crcs(static_cast<std::size_t>(pieces));
  std::atomic<int> failure{0};  // errno of a failed read, or -1 for a file that ends early
#pragma omp parallel for schedule(static)
  for (std::int64_t piece = 0; piece < pieces; ++piece) {
    const std::int64_t first = piece * direct_piece_elements;
    const std::size_t bytes = static_cast<std::size_t>(std::min(direct_piece_elements, count - first)) * sizeof(float);
    auto* out = reinterpret_cast<char*>(values + first);
    if (failure.load(std::memory_order_relaxed) != 0) continue;
    // Through a cache-sized buffer: checksummed there, then streamed into the state, which a replicated read fills
    // from memory it does not need to read first (core/copy_bytes.hpp).
    const auto [first_checked, end_checked] = checked(piece);
    const auto checked_from = static_cast<std::size_t>(first_checked - first) * sizeof(float);
    const auto checked_to = static_cast<std::size_t>(end_checked - first) * sizeof(float);
    std::uint32_t crc = 0;
    const auto checksum = [&](const unsigned char* bytes_read, std::size_t position, std::size_t length) {
      const std::size_t from = std::max(position, checked_from), to = std::min(position + length, checked_to);
      if (to > from) crc = crc32(bytes_read + (from - position), to - from, crc);
    };
    if (const int status = read_at_streaming(descriptor, out, bytes,
                                             offset + static_cast<std::uint64_t>(first) * sizeof(float), checksum);
        status != 0) {
      failure.store(status);
      continue;
    }
    crcs[static_cast<std::size_t>(piece)] = crc;
  }
  if (const int error = failure.load(); error != 0)
    throw CheckpointDamaged("checkpoint '" + file + "' is damaged: tensor " + tensor + " cannot be read (" +
                                (error < 0 ? std::string("the file ends inside it") : std::strerror(error)) + ")",
                            "'hpctrain checkpoint verify " + file + "' checks it; resume from an older checkpoint");
  std::uint32_t crc = 0;
  for (std::int64_t piece = 0; piece < pieces; ++piece) {
    const auto [first_checked, end_checked] = checked(piece);
    if (end_checked > first_checked)
      crc = static_cast<std::uint32_t>(
          crc32_combine(crc, crcs[static_cast<std::size_t>(piece)],
                        static_cast<z_off_t>((end_checked - first_checked) * std::int64_t{sizeof(float)})));
  }
  return crc;
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

// An object (group or dataset) of the file by path, for its attributes.
H5Handle open_object(hid_t file, const std::string& path) {
  return H5Handle(HPCTRAIN_H5_CHECK(H5Oopen(file, path.c_str(), H5P_DEFAULT)));
}

}  // namespace

// --- writing ---

// This rank's parts of each tensor (collective: every rank calls for every tensor).
void CheckpointFileWriter::write_vector(const std::vector<FlatTensor>& tensors, const float* flat, std::int64_t count,
                                        std::optional<std::span<const ElementRange>> owned) {
  // This rank's parts of the vector: its slice, or the ranges it owns (a sharded optimizer's state, current there).
  std::vector<ElementRange> parts;
  if (owned) {
    parts.assign(owned->begin(), owned->end());
    if (parts.empty()) parts.push_back({0, 0});  // a rank that owns nothing still selects nothing, once (below)
  } else {
    const auto [slice_begin, slice_end] = part_slice(count, mpi_.rank(), mpi_.size());
    parts.push_back({slice_begin, slice_end});
  }
  const std::vector<std::uint32_t> checksums = tensor_checksums(tensors, flat, parts, mpi_);
  OwnedDescriptor opened;
  const int descriptor = posix_descriptor(file_, opened);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const FlatTensor& tensor = tensors[t];
    write_step_collectively(mpi_, [&] {
      const CheckpointPhaseScope phase(CheckpointPhase::metadata);
      H5Handle dataset = create_dataset(file_, tensor.path, H5T_IEEE_F32LE, tensor.shape);
      // This rank's parts of the tensor; independent I/O: each is one contiguous range of the file, which collective
      // buffering would only shuffle between the ranks first. (A rank with no part still selects nothing, once.)
      bool wrote = false;
      for (std::size_t p = 0; p < parts.size(); ++p) {
        const std::int64_t part_begin = std::max(tensor.offset, parts[p].begin);
        const std::int64_t part_end = std::max(part_begin, std::min(tensor.offset + tensor.count, parts[p].end));
        if (part_begin == part_end && (wrote || p + 1 < parts.size())) continue;
        // Pieces only where the write-out can be started (a descriptor); otherwise one write per part.
        const std::int64_t piece_elements = descriptor >= 0 ? write_piece_elements : part_end - part_begin;
        std::int64_t piece = part_begin;
        do {
          const std::int64_t piece_end = std::min(piece + piece_elements, part_end);
          const SliceSelection slice = select_slice(dataset.get(), tensor, piece, piece_end);
          const CheckpointPhaseScope data(CheckpointPhase::data);
          HPCTRAIN_H5_CHECK(H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, slice.memory.get(), slice.file.get(), H5P_DEFAULT,
                                     flat + tensor.offset + static_cast<std::int64_t>(slice.first)));
          start_writeback(descriptor);
          piece = piece_end;
        } while (piece < part_end);
        wrote = true;
      }
      write_crc(dataset.get(), checksums[t]);  // the same value on every rank, as a collective attribute needs
    });
  }
}

void CheckpointFileWriter::write_int64(const std::string& path, std::int64_t value) {
  write_step_collectively(
      mpi_, [&] { write_scalar<std::int64_t>(file_, path, H5T_STD_I64LE, H5T_NATIVE_INT64, value, mpi_, transfer_); });
}

void CheckpointFileWriter::write_uint64(const std::string& path, std::uint64_t value) {
  write_step_collectively(mpi_, [&] {
    write_scalar<std::uint64_t>(file_, path, H5T_STD_U64LE, H5T_NATIVE_UINT64, value, mpi_, transfer_);
  });
}

void CheckpointFileWriter::write_float(const std::string& path, float value) {
  write_step_collectively(
      mpi_, [&] { write_scalar<float>(file_, path, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, value, mpi_, transfer_); });
}

void CheckpointFileWriter::write_double(const std::string& path, double value) {
  write_step_collectively(
      mpi_, [&] { write_scalar<double>(file_, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, value, mpi_, transfer_); });
}

void CheckpointFileWriter::write_string_attribute(const std::string& object, const std::string& name,
                                                  const std::string& value) {
  write_step_collectively(mpi_,
                          [&] { hpctrain::write_string_attribute(open_object(file_, object).get(), name, value); });
}

void CheckpointFileWriter::write_integer_attribute(const std::string& object, const std::string& name,
                                                   std::int64_t value) {
  write_step_collectively(mpi_,
                          [&] { hpctrain::write_integer_attribute(open_object(file_, object).get(), name, value); });
}

// --- reading ---

namespace {

// Reads elements [begin, end) of `tensor` (offsets in the flat vector) into flat and returns the CRC-32 of its part
// [checked_begin, checked_end): in pieces, each checksummed right after it is read; directly, on all the rank's
// threads, where the values lie in the file as they are (`descriptor` >= 0), otherwise through HDF5.
std::uint32_t read_tensor_range(hid_t dataset, const FlatTensor& tensor, float* flat, std::int64_t begin,
                                std::int64_t end, std::int64_t checked_begin, std::int64_t checked_end, int descriptor,
                                const std::string& file) {
  const std::optional<std::uint64_t> raw =
      descriptor >= 0 && end > begin ? raw_float_offset(dataset, tensor.count) : std::nullopt;
  if (raw) {
    const CheckpointPhaseScope data(CheckpointPhase::data);  // the checksums included: they run in the same pass
    return read_raw_floats(descriptor, *raw + static_cast<std::uint64_t>(begin - tensor.offset) * sizeof(float),
                           flat + begin, end - begin, checked_begin - begin, checked_end - begin, file, tensor.path);
  }
  std::uint32_t crc = 0;
  for (std::int64_t piece = begin; piece < end; piece += read_piece_elements) {
    const std::int64_t piece_end = std::min(piece + read_piece_elements, end);
    const SliceSelection slice = select_slice(dataset, tensor, piece, piece_end);
    {
      const CheckpointPhaseScope data(CheckpointPhase::data);
      HPCTRAIN_H5_CHECK(
          H5Dread(dataset, H5T_NATIVE_FLOAT, slice.memory.get(), slice.file.get(), H5P_DEFAULT, flat + piece));
    }
    const CheckpointPhaseScope checksum(CheckpointPhase::checksum);
    const std::int64_t first = std::max(piece, checked_begin), last = std::min(piece_end, checked_end);
    if (last > first) crc = crc32(flat + first, static_cast<std::size_t>(last - first) * sizeof(float), crc);
  }
  return crc;
}

}  // namespace

// Each rank reads its share of each tensor into flat (read_share), then the shares are gathered: afterwards every
// rank holds the whole vector. Each rank checksums a disjoint part of what it read, and the checksums are checked on
// the assembled tensors. With `owned`, each rank reads and checksums its own ranges only and nothing is gathered.
void CheckpointFileReader::read_vector(const std::vector<FlatTensor>& tensors, float* flat, std::int64_t count,
                                       std::optional<std::span<const ElementRange>> owned) {
  const ReadShare share = read_share(count, mpi_);
  std::vector<ChecksumPiece> pieces;  // what this rank checksummed
  // Under MPI-IO each rank reads through a descriptor of its own (what ROMIO's independent reads do underneath).
  // Without one, HDF5 reads.
  OwnedDescriptor opened;
  const int posix = posix_descriptor(file_, opened);
  const int descriptor = posix >= 0 && addresses_are_file_offsets(file_) ? posix : -1;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const FlatTensor& tensor = tensors[t];
    const CheckpointPhaseScope phase(CheckpointPhase::metadata);
    HPCTRAIN_VERIFY(
        link_exists(file_, tensor.path), CheckpointMismatch,
        "checkpoint '" << path_ << "' has no tensor " << tensor.path << ": it was written for a different model",
        "resume with the deck the checkpoint was written with (stored in its 'deck' attribute)");
    H5Handle dataset(HPCTRAIN_H5_CHECK(H5Dopen2(file_, tensor.path.c_str(), H5P_DEFAULT)));
    H5Handle file_space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset.get())));
    const auto shape = dataspace_shape(file_space.get());
    HPCTRAIN_VERIFY(shape == tensor.shape, CheckpointMismatch,
                    "checkpoint '" << path_ << "': tensor " << tensor.path << " has shape " << shape_text(shape)
                                   << " but the deck's model needs " << shape_text(tensor.shape),
                    "resume with the deck the checkpoint was written with (stored in its 'deck' attribute)");
    if (owned) {
      for (const ElementRange& range : *owned) {
        const std::int64_t begin = std::max(tensor.offset, range.begin);
        const std::int64_t end = std::min(tensor.offset + tensor.count, range.end);
        if (begin >= end) continue;
        const std::uint32_t crc =
            read_tensor_range(dataset.get(), tensor, flat, begin, end, begin, end, descriptor, path_);
        pieces.push_back(
            {t, static_cast<std::uint64_t>(begin), crc, static_cast<std::uint64_t>(end - begin) * sizeof(float)});
      }
      continue;
    }
    // This rank's share of the tensor, checksummed as far as it is this rank's part to check.
    const std::int64_t begin = std::max(tensor.offset, share.begin);
    const std::int64_t end = std::min(tensor.offset + tensor.count, share.end);
    const std::int64_t checked_begin = std::clamp(share.checked_begin, begin, std::max(begin, end));
    const std::int64_t checked_end = std::clamp(share.checked_end, checked_begin, std::max(begin, end));
    const std::uint32_t crc =
        read_tensor_range(dataset.get(), tensor, flat, begin, end, checked_begin, checked_end, descriptor, path_);
    pieces.push_back({t, static_cast<std::uint64_t>(share.checked_begin), crc,
                      static_cast<std::uint64_t>(checked_end - checked_begin) * sizeof(float)});
  }
  // Checksums of the whole tensors from the parts just read, before the shares are assembled.
  const std::vector<std::uint32_t> checksums = combine_pieces(pieces, tensors.size(), mpi_);
  if (!owned) gather_shares(flat, count, mpi_);
  const CheckpointPhaseScope phase(CheckpointPhase::metadata);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const FlatTensor& tensor = tensors[t];
    H5Handle dataset(HPCTRAIN_H5_CHECK(H5Dopen2(file_, tensor.path.c_str(), H5P_DEFAULT)));
    const std::uint32_t stored = read_crc(dataset.get(), tensor.path, path_);
    HPCTRAIN_VERIFY(stored == checksums[t], CheckpointDamaged,
                    "checkpoint '" << path_ << "' is damaged: tensor " << tensor.path << " fails its checksum");
  }
}

std::int64_t CheckpointFileReader::read_int64(const std::string& path) {
  return read_scalar<std::int64_t>(file_, path, H5T_NATIVE_INT64, path_);
}

std::uint64_t CheckpointFileReader::read_uint64(const std::string& path) {
  return read_scalar<std::uint64_t>(file_, path, H5T_NATIVE_UINT64, path_);
}

float CheckpointFileReader::read_float(const std::string& path) {
  return read_scalar<float>(file_, path, H5T_NATIVE_FLOAT, path_);
}

double CheckpointFileReader::read_double(const std::string& path) {
  return read_scalar<double>(file_, path, H5T_NATIVE_DOUBLE, path_);
}

bool CheckpointFileReader::has(const std::string& path) const { return link_exists(file_, path); }

std::string CheckpointFileReader::read_string_attribute(const std::string& object, const std::string& name) {
  HPCTRAIN_VERIFY(link_exists(file_, object), CheckpointDamaged,
                  "checkpoint '" << path_ << "' is damaged: it has no " << object);
  return hpctrain::read_string_attribute(open_object(file_, object).get(), name);
}

void read_checkpoint_file(const std::string& path, const MpiEnvironment& mpi,
                          const std::function<void(CheckpointFileReader&)>& read) {
  silence_hdf5_error_printing();
  require_regular_file(path, "checkpoint");
  // A failing HDF5 call (damaged metadata, a truncated file) becomes CheckpointDamaged naming the file and what HDF5
  // found, without HDF5's call text.
  try {
    const auto lock = lock_hdf5();
    H5Handle file;
    try {
      const CheckpointPhaseScope phase(CheckpointPhase::create_open);
      file = open_file_collectively(path, mpi.world());
    } catch (const LibraryError&) {
      throw CheckpointDamaged("checkpoint '" + path + "' cannot be opened: missing, truncated or not an HDF5 file");
    }
    HPCTRAIN_VERIFY(
        attribute_exists(file.get(), "format") && read_string_attribute(file.get(), "format") == checkpoint_format,
        CheckpointDamaged, "'" << path << "' is not an hpctrain checkpoint (" << checkpoint_format << ")");
    CheckpointFileReader reader(file.get(), path, mpi);
    read(reader);
    const CheckpointPhaseScope phase(CheckpointPhase::close);
    file.close();
  } catch (const LibraryError& error) {
    throw CheckpointDamaged("checkpoint '" + path + "' is damaged: its HDF5 structure cannot be read (" +
                                (error.detail().empty() ? std::string("no detail") : error.detail()) + ")",
                            "'hpctrain checkpoint verify " + path + "' checks it; resume from an older checkpoint");
  }
}

}  // namespace hpctrain
