// copy_bytes: memcpy, or vector moves where memcpy's `rep movsb` would alias (see copy_bytes.hpp).
#include "hpctrain/core/copy_bytes.hpp"

#include <cstdint>
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
}  // namespace

void copy_bytes(void* to, const void* from, std::size_t bytes) {
  const std::size_t distance =
      (reinterpret_cast<std::uintptr_t>(to) - reinterpret_cast<std::uintptr_t>(from)) % page_bytes;
  auto* out = static_cast<unsigned char*>(to);
  const auto* in = static_cast<const unsigned char*>(from);
  std::size_t done = 0;
  if (bytes >= string_copy_bytes && distance != 0 && distance < aliasing_distance) {
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

}  // namespace hpctrain
