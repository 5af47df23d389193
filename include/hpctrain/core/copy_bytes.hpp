// A memcpy and a pread for copies out of files and staged data: their speed, without their slow case on AMD Zen 3; and
// the prefetching of scattered rows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace hpctrain {

// Copies `bytes` bytes from `from` to `to` (the regions must not overlap), as std::memcpy.
//
// Why not plain memcpy: glibc (2.36, Debian 12) copies blocks from 2 KiB up with `rep movsb`, and so does the kernel's
// read(). On AMD Zen 3 that instruction runs 4-6x slower (1.5-2.5 GB/s instead of 9-12) when the destination lies
// 1-31 bytes past the source modulo 4 KiB: every store then shares its page offset with a load still in flight.
// A batch buffer from malloc starts 16 bytes past a page, so rows of a whole number of pages read out of a file whose
// chunks are page-aligned (HDF5's H5Pset_alignment, `h5repack -a 4096`, paged files) hit it on every row. Such
// copies use vector moves, whose speed does not depend on the distance; all others go to memcpy.
void copy_bytes(void* to, const void* from, std::size_t bytes);

// Copies as copy_bytes, but with non-temporal stores: they skip reading the destination's cache lines first, so a
// copy into memory that is not in cache moves two bytes per byte instead of three. For large destinations that are not
// read again soon (a checkpoint's state); small copies, and builds without SSE2, go to memcpy.
void stream_bytes(void* to, const void* from, std::size_t bytes);

// Reads `bytes` bytes at byte `offset` of an open file into `to`, all of them (short reads and EINTR retried), through
// a cache-sized buffer: each piece of at most 256 KiB goes through pread into it at the file's page offset (the
// kernel's copy out of the page cache uses `rep movsb` too, and would crawl at copy_bytes' slow distances), is handed
// to `visit(bytes, position, length)` while it is in cache (position: bytes from the start of the request; pieces in
// order), then goes to `to` with stream_bytes. Returns 0, the errno of a failed read, or -1 when the file ends first.
// Where `to` is not in cache, two processes that read a cached 1 GB file this way took 0.85-0.9x the time of preads
// straight into it (docs/performance.md).
using ReadVisitor = std::function<void(const unsigned char* bytes, std::size_t position, std::size_t length)>;
int read_at_streaming(int descriptor, void* to, std::size_t bytes, std::uint64_t offset, const ReadVisitor& visit);

// For copies of scattered rows (a global shuffle's reads, out of a file's map or out of staged memory): a random row
// is a cache and TLB miss the copy would wait for, so the caller prefetches the rows after the one it copies, about
// 8 KiB of them (at least one row, at most 32), and their loads overlap the copy. The prefetches fill the level-2
// cache, not level 1 (prefetcht1): a level-1 prefetch holds one of the core's few level-1 miss buffers until its line
// arrives, so 8 KiB in flight stalled the loop on full buffers, while the level-2 cache tracks more misses at once and
// the copy's loads then hit in it. `hpctrain data bench` on a 2-core AMD EPYC (Zen 4), random 1 KiB rows out of a
// cached file: 1.63x in a first epoch, 1.88x in later ones; 16 KiB rows 1.06-1.09x (docs/performance.md).
class RowPrefetch {
 public:
  explicit RowPrefetch(std::size_t row_bytes)
      : rows_ahead_(static_cast<std::int64_t>(
            std::clamp<std::size_t>(ahead_bytes / std::max<std::size_t>(row_bytes, 1), 1, 32))),
        bytes_(std::clamp<std::size_t>(row_bytes, 1, ahead_bytes)) {}
  // Rows to keep prefetched ahead of the one being copied.
  [[nodiscard]] std::int64_t rows_ahead() const { return rows_ahead_; }
  // Prefetches a row: its first 8 KiB, and the line a row not aligned to 64 bytes ends in.
  void operator()(const void* row) const {
    const auto* first = static_cast<const unsigned char*>(row);
    for (std::size_t byte = 0; byte < bytes_; byte += 64) __builtin_prefetch(first + byte, 0, level_2);
    __builtin_prefetch(first + bytes_ - 1, 0, level_2);
  }

 private:
  static constexpr std::size_t ahead_bytes = 8192;
  static constexpr int level_2 = 2;  // __builtin_prefetch's locality 2: prefetcht1 on x86
  std::int64_t rows_ahead_;
  std::size_t bytes_;
};

}  // namespace hpctrain
