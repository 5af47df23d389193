// copy_bytes: memcpy, or vector moves where memcpy's `rep movsb` would alias (see copy_bytes.hpp); stream_bytes: vector
// moves with streaming stores; read_at_streaming: preads through a cache-sized bounce buffer, then stream_bytes.
#include "hpctrain/core/copy_bytes.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

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
// read_at_streaming's pieces: within a core's L2 (512 KiB on Zen 3, 1-2 MiB on recent Xeons), so the visit and the
// copy after the pread find them in cache; 64 KiB to 1 MiB measured alike.
constexpr std::size_t bounce_bytes = std::size_t{256} << 10;

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

// This thread's bounce buffer (null where it cannot be had): bounce_bytes from a page boundary, plus a page for a
// file's page offset.
unsigned char* thread_bounce() {
  struct Bounce {
    unsigned char* bytes = static_cast<unsigned char*>(std::aligned_alloc(page_bytes, bounce_bytes + page_bytes));
    Bounce() = default;
    Bounce(const Bounce&) = delete;
    Bounce& operator=(const Bounce&) = delete;
    ~Bounce() { std::free(bytes); }
  };
  thread_local Bounce bounce;
  return bounce.bytes;
}

#if defined(__AVX__) || defined(__SSE2__)
// 64 bytes in explicit vector loads and stores (a plain byte loop could be turned back into a memcpy call by the
// compiler); streaming stores, which need `to` on a 64-byte boundary, or plain ones.
template <bool streaming>
inline void move_64_bytes(unsigned char* to, const unsigned char* from) {
#if defined(__AVX__)
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
  const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 32));
  if constexpr (streaming) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to), low);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + 32), high);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), low);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 32), high);
  }
#else
  __m128i parts[4];
  for (int part = 0; part < 4; ++part)
    parts[part] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 16 * part));
  for (int part = 0; part < 4; ++part) {
    if constexpr (streaming) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(to + 16 * part), parts[part]);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to + 16 * part), parts[part]);
    }
  }
#endif
}
#endif

}  // namespace

void copy_bytes(void* to, const void* from, std::size_t bytes) {
  auto* out = static_cast<unsigned char*>(to);
  const auto* in = static_cast<const unsigned char*>(from);
  std::size_t done = 0;
  if (slow_distance(reinterpret_cast<std::uintptr_t>(to), reinterpret_cast<std::uintptr_t>(from), bytes)) {
#if defined(__AVX__) || defined(__SSE2__)
    for (; done + 64 <= bytes; done += 64) move_64_bytes<false>(out + done, in + done);
#endif
  }
  std::memcpy(out + done, in + done, bytes - done);  // everything, or the tail under 64 bytes
}

void stream_bytes(void* to, const void* from, std::size_t bytes) {
  auto* out = static_cast<unsigned char*>(to);
  const auto* in = static_cast<const unsigned char*>(from);
#if defined(__AVX__) || defined(__SSE2__)
  constexpr std::size_t block = 64;  // a cache line: whole lines are streamed, so none is read first
  if (bytes < 4 * block) {
    std::memcpy(out, in, bytes);
    return;
  }
  const std::size_t head = (block - reinterpret_cast<std::uintptr_t>(out) % block) % block;
  std::memcpy(out, in, head);
  std::size_t done = head;
  for (; done + block <= bytes; done += block) move_64_bytes<true>(out + done, in + done);
  _mm_sfence();  // streaming stores are weakly ordered: make them visible before anyone reads the destination
  std::memcpy(out + done, in + done, bytes - done);
#else
  std::memcpy(out, in, bytes);
#endif
}

int read_at_streaming(int descriptor, void* to, std::size_t bytes, std::uint64_t offset, const ReadVisitor& visit) {
  auto* out = static_cast<unsigned char*>(to);
  unsigned char* const bounce = thread_bounce();
  if (bounce == nullptr) return ENOMEM;
  const std::size_t shift = offset % page_bytes;  // the file's page offset: the kernel's copy at distance 0
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t length = std::min(bounce_bytes, bytes - done);
    if (const int status = read_fully(descriptor, bounce + shift, length, offset + done); status != 0) return status;
    if (visit) visit(bounce + shift, done, length);
    stream_bytes(out + done, bounce + shift, length);
    done += length;
  }
  return 0;
}

}  // namespace hpctrain
