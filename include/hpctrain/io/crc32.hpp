// CRC-32 (IEEE 802.3, the one zlib.crc32 computes) at memory speed: checkpoints checksum every byte they write and
// read. Carry-less multiplication folds the message 64, 128 or 256 bytes at a time (PCLMULQDQ, or VPCLMULQDQ with AVX2
// or AVX-512); the last bytes and the final reduction go through zlib, so every kernel gives zlib's value bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hpctrain {

// CRC-32 of `bytes` bytes, continuing from `crc` (zlib.crc32's convention: 0 starts), with the fastest kernel this CPU
// runs.
std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc = 0);

// The same value on all of the OpenMP threads: pieces of 1 MiB checksummed in parallel, joined in order (zlib's
// crc32_combine). For buffers far larger than the cache (a checkpoint's state), where one core's loads are the
// limit; inside a parallel region it runs on the calling thread alone.
std::uint32_t crc32_parallel(const void* data, std::size_t bytes, std::uint32_t crc = 0);

// The kernels, for tests and measurements: zlib's own loop, folding with 128-bit PCLMULQDQ, with 256-bit VPCLMULQDQ
// (AVX2), with 512-bit VPCLMULQDQ (AVX-512).
enum class Crc32Kernel { zlib, clmul128, clmul256, clmul512 };
[[nodiscard]] bool crc32_kernel_available(Crc32Kernel kernel);
// Throws std::invalid_argument when the kernel is not available on this CPU.
std::uint32_t crc32_with(Crc32Kernel kernel, const void* data, std::size_t bytes, std::uint32_t crc = 0);

}  // namespace hpctrain
