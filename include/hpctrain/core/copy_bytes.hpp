// A memcpy and a pread for copies out of files and staged data: their speed, without their slow case on AMD Zen 3.
#pragma once

#include <cstddef>
#include <cstdint>

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

// Reads `bytes` bytes at byte `offset` of an open file into `to`, all of them (short reads and EINTR retried).
// Returns 0, the errno of a failed read, or -1 when the file ends first. The kernel's copy out of the page cache uses
// `rep movsb` as well, with the same slow distances: where `to` lies 1-63 bytes past the file offset modulo 4 KiB
// the bytes go through a page-aligned buffer at the file's page offset (a read at full speed), then copy_bytes.
int read_at(int descriptor, void* to, std::size_t bytes, std::uint64_t offset);

}  // namespace hpctrain
