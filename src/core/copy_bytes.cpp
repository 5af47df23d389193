// copy_bytes: memcpy, or vector moves where memcpy's `rep movsb` would alias; read_at: pread, through a bounce buffer
// where the kernel's copy would (see copy_bytes.hpp).
#include "hpctrain/core/copy_bytes.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#if defined(__AVX__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hpctrain {

namespace {
constexpr std::size_t page_bytes = 4096;
constexpr std::size_t aliasing_distance = 64;    // measured slow at 1-31 bytes, fast from 32: a line of margin
constexpr std::size_t string_copy_bytes = 2048;  // glibc's memcpy uses `rep movsb` from here up
constexpr std::size_t bounce_bytes = std::size_t{1} << 20;  // per thread: a checkpoint reader's piece

bool slow_distance(std::uintptr_t to, std::uintptr_t from, std::size_t bytes) {
  const std::size_t distance = (to - from) % page_bytes;
  return bytes >= string_copy_bytes && distance != 0 && distance < aliasing_distance;
}

// pread until `bytes` are in or the file ends: 0, errno, or -1 at the end of the file.
int read_fully(int descriptor, unsigned char* to, std::size_t bytes, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t got = pread(descriptor, to + done, bytes - done, static_cast<off_t>(offset + done));
    if (got > 0) {
      done += static_cast<std::size_t>(got);
    } else if (got == 0) {
      return -1;
    } else if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}
}  // namespace

void copy_bytes(void* to, const void* from, std::size_t bytes) {
  auto* out = static_cast<unsigned char*>(to);
  const auto* in = static_cast<const unsigned char*>(from);
  std::size_t done = 0;
  if (slow_distance(reinterpret_cast<std::uintptr_t>(to), reinterpret_cast<std::uintptr_t>(from), bytes)) {
    // Explicit vector loads and stores: a plain byte loop could be turned back into a memcpy call by the compiler.
#if defined(__AVX__)
    for (; done + 64 <= bytes; done += 64) {
      const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + done));
      const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + done + 32));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + done), low);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + done + 32), high);
    }
#elif defined(__SSE2__)
    for (; done + 64 <= bytes; done += 64) {
      __m128i parts[4];
      for (int part = 0; part < 4; ++part)
        parts[part] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 16 * part));
      for (int part = 0; part < 4; ++part)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + done + 16 * part), parts[part]);
    }
#endif
  }
  std::memcpy(out + done, in + done, bytes - done);  // everything, or the tail under 64 bytes
}

int read_at(int descriptor, void* to, std::size_t bytes, std::uint64_t offset) {
  auto* out = static_cast<unsigned char*>(to);
  // The file's bytes sit in the page cache at their page offset: that is the source address modulo 4 KiB.
  if (!slow_distance(reinterpret_cast<std::uintptr_t>(to), static_cast<std::uintptr_t>(offset), bytes))
    return read_fully(descriptor, out, bytes, offset);
  thread_local std::unique_ptr<unsigned char, decltype(&std::free)> bounce(nullptr, &std::free);
  if (!bounce) bounce.reset(static_cast<unsigned char*>(std::aligned_alloc(page_bytes, bounce_bytes + page_bytes)));
  if (!bounce) return ENOMEM;
  const std::size_t shift = offset % page_bytes;  // the bounce copy starts at the file's page offset: distance 0
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t length = std::min(bounce_bytes, bytes - done);
    if (const int status = read_fully(descriptor, bounce.get() + shift, length, offset + done); status != 0)
      return status;
    copy_bytes(out + done, bounce.get() + shift, length);
    done += length;
  }
  return 0;
}

}  // namespace hpctrain
