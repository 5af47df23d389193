// CRC-32 by carry-less multiplication folding.
//
// The message is a polynomial over GF(2); in zlib's bit order (reflected) byte 0's lowest bit is its highest
// coefficient. A 128-bit register loaded little-endian from 16 bytes thus holds coefficients x^127 (bit 0) down to x^0
// (bit 127) of its piece. Moving a piece `distance` bits further along the message multiplies it by x^distance; modulo
// the generator P only the remainder matters, so with the register's low half L (coefficients x^127..x^64) and high
// half H (x^63..x^0):
//   piece * x^distance = L * x^(distance + 64) + H * x^distance
//                     == L * (x^(distance + 63) mod P) * x + H * (x^(distance - 1) mod P) * x   (mod P),
// a value below x^128 that is added (XOR) to the piece found `distance` bits later. PCLMULQDQ of two reflected 64-bit
// halves returns the reflected product one place off, which is the factor x above; the constants are the two
// remainders reflected into 64 bits (fold_constants). Four registers (or four 512-bit registers of four pieces each)
// fold independently, hiding the multiplier's latency, then fold into one. zlib's table loop then reduces the last
// 128-bit piece (a raw CRC register of 0 over its 16 bytes gives piece * x^32 mod P) and goes on over the remaining
// bytes. The initial CRC enters as zlib's does: its complement XORed into the first four bytes.
#include "hpctrain/io/crc32.hpp"

#include <omp.h>
#include <zlib.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hpctrain {

namespace {

// zlib's CRC-32, in pieces its 32-bit length argument can take.
std::uint32_t zlib_crc32(std::uint32_t crc, const unsigned char* byte, std::size_t bytes) {
  while (bytes > 0) {
    const auto piece = static_cast<uInt>(std::min<std::size_t>(bytes, std::size_t{1} << 30));
    crc = static_cast<std::uint32_t>(::crc32(crc, byte, piece));
    byte += piece;
    bytes -= piece;
  }
  return crc;
}

#if defined(__x86_64__)

// x^n mod P for CRC-32's generator P = x^32 + x^26 + ... + 1 (bit i: the coefficient of x^i).
constexpr std::uint64_t x_power_mod_p(unsigned n) {
  std::uint64_t remainder = 1;
  for (unsigned i = 0; i < n; ++i) {
    remainder <<= 1;
    if ((remainder >> 32) & 1) remainder ^= 0x104C11DB7ull;
  }
  return remainder;
}

// Bit i to bit 63 - i.
constexpr std::uint64_t reflect64(std::uint64_t value) {
  std::uint64_t reflected = 0;
  for (int i = 0; i < 64; ++i)
    if ((value >> i) & 1) reflected |= std::uint64_t{1} << (63 - i);
  return reflected;
}

// The multipliers that fold a 128-bit piece `distance` bits forward: for its low and its high half.
struct FoldConstants {
  std::uint64_t low, high;
};
constexpr FoldConstants fold_constants(unsigned distance) {
  return {reflect64(x_power_mod_p(distance + 63)), reflect64(x_power_mod_p(distance - 1))};
}
constexpr FoldConstants fold_128 = fold_constants(128), fold_256 = fold_constants(256), fold_512 = fold_constants(512),
                        fold_1024 = fold_constants(1024), fold_2048 = fold_constants(2048);

#define HPCTRAIN_CLMUL128 __attribute__((target("pclmul,sse4.1")))
#define HPCTRAIN_CLMUL256 __attribute__((target("pclmul,sse4.1,avx2,vpclmulqdq")))
#define HPCTRAIN_CLMUL512 __attribute__((target("pclmul,sse4.1,avx512f,avx512vl,vpclmulqdq")))

HPCTRAIN_CLMUL128 __m128i constants128(FoldConstants k) {
  return _mm_set_epi64x(static_cast<long long>(k.high), static_cast<long long>(k.low));
}

// piece * x^distance + next (mod P, below x^128), with k = constants128(fold_constants(distance)).
HPCTRAIN_CLMUL128 inline __m128i fold(__m128i piece, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(piece, k, 0x00), _mm_clmulepi64_si128(piece, k, 0x11)), next);
}

HPCTRAIN_CLMUL128 inline __m128i load128(const unsigned char* byte) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(byte));
}

// The CRC of a message whose folded remainder is `piece`, followed by `bytes` more bytes.
HPCTRAIN_CLMUL128 std::uint32_t finish(__m128i piece, const unsigned char* byte, std::size_t bytes) {
  const __m128i k128 = constants128(fold_128);
  for (; bytes >= 16; byte += 16, bytes -= 16) piece = fold(piece, k128, load128(byte));
  unsigned char last[16];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(last), piece);
  // zlib starts its register at ~crc: 0xFFFFFFFF gives a register of 0, so the result is ~(piece * x^32 mod P).
  return zlib_crc32(zlib_crc32(0xFFFFFFFFu, last, 16), byte, bytes);
}

HPCTRAIN_CLMUL128 std::uint32_t crc32_clmul128(std::uint32_t crc, const unsigned char* byte, std::size_t bytes) {
  if (bytes < 64) return zlib_crc32(crc, byte, bytes);
  const __m128i k512 = constants128(fold_512), k128 = constants128(fold_128);
  __m128i x0 = _mm_xor_si128(load128(byte), _mm_cvtsi32_si128(static_cast<int>(~crc)));
  __m128i x1 = load128(byte + 16), x2 = load128(byte + 32), x3 = load128(byte + 48);
  for (byte += 64, bytes -= 64; bytes >= 64; byte += 64, bytes -= 64) {
    x0 = fold(x0, k512, load128(byte));
    x1 = fold(x1, k512, load128(byte + 16));
    x2 = fold(x2, k512, load128(byte + 32));
    x3 = fold(x3, k512, load128(byte + 48));
  }
  return finish(fold(fold(fold(x0, k128, x1), k128, x2), k128, x3), byte, bytes);
}

HPCTRAIN_CLMUL256 __m256i constants256(FoldConstants k) {
  const auto low = static_cast<long long>(k.low), high = static_cast<long long>(k.high);
  return _mm256_set_epi64x(high, low, high, low);
}

// Two 128-bit pieces side by side: the same fold on each.
HPCTRAIN_CLMUL256 inline __m256i fold2(__m256i pieces, __m256i k, __m256i next) {
  return _mm256_xor_si256(
      _mm256_xor_si256(_mm256_clmulepi64_epi128(pieces, k, 0x00), _mm256_clmulepi64_epi128(pieces, k, 0x11)), next);
}

// A lambda would not inherit the caller's target: the helpers carry it themselves.
HPCTRAIN_CLMUL256 inline __m256i load256(const unsigned char* byte) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(byte));
}

// For CPUs with VPCLMULQDQ but without AVX-512 (AMD Zen 3, Intel Alder Lake): one instruction multiplies two pieces,
// where PCLMULQDQ's throughput bounds the 128-bit kernel (11 GB/s on Zen 3).
HPCTRAIN_CLMUL256 std::uint32_t crc32_clmul256(std::uint32_t crc, const unsigned char* byte, std::size_t bytes) {
  if (bytes < 128) return crc32_clmul128(crc, byte, bytes);
  const __m256i k1024 = constants256(fold_1024), k256 = constants256(fold_256);
  __m256i x0 = _mm256_xor_si256(load256(byte), _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  __m256i x1 = load256(byte + 32), x2 = load256(byte + 64), x3 = load256(byte + 96);
  for (byte += 128, bytes -= 128; bytes >= 128; byte += 128, bytes -= 128) {
    x0 = fold2(x0, k1024, load256(byte));
    x1 = fold2(x1, k1024, load256(byte + 32));
    x2 = fold2(x2, k1024, load256(byte + 64));
    x3 = fold2(x3, k1024, load256(byte + 96));
  }
  // 32 bytes of pieces, in message order, into one 128-bit piece.
  const __m256i pieces = fold2(fold2(fold2(x0, k256, x1), k256, x2), k256, x3);
  return finish(fold(_mm256_castsi256_si128(pieces), constants128(fold_128), _mm256_extracti128_si256(pieces, 1)), byte,
                bytes);
}

HPCTRAIN_CLMUL512 __m512i constants512(FoldConstants k) {
  const auto low = static_cast<long long>(k.low), high = static_cast<long long>(k.high);
  return _mm512_set_epi64(high, low, high, low, high, low, high, low);
}

// Four 128-bit pieces side by side: the same fold on each.
HPCTRAIN_CLMUL512 inline __m512i fold4(__m512i pieces, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(pieces, k, 0x00), _mm512_clmulepi64_epi128(pieces, k, 0x11),
                                   next, 0x96);  // a ^ b ^ c
}

HPCTRAIN_CLMUL512 std::uint32_t crc32_clmul512(std::uint32_t crc, const unsigned char* byte, std::size_t bytes) {
  if (bytes < 256) return crc32_clmul128(crc, byte, bytes);
  const __m512i k2048 = constants512(fold_2048), k512 = constants512(fold_512);
  __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(byte), _mm512_maskz_set1_epi32(1, static_cast<int>(~crc)));
  __m512i x1 = _mm512_loadu_si512(byte + 64), x2 = _mm512_loadu_si512(byte + 128), x3 = _mm512_loadu_si512(byte + 192);
  for (byte += 256, bytes -= 256; bytes >= 256; byte += 256, bytes -= 256) {
    x0 = fold4(x0, k2048, _mm512_loadu_si512(byte));
    x1 = fold4(x1, k2048, _mm512_loadu_si512(byte + 64));
    x2 = fold4(x2, k2048, _mm512_loadu_si512(byte + 128));
    x3 = fold4(x3, k2048, _mm512_loadu_si512(byte + 192));
  }
  // 64 bytes of pieces, in message order, into one 128-bit piece.
  alignas(64) unsigned char pieces[64];
  _mm512_store_si512(pieces, fold4(fold4(fold4(x0, k512, x1), k512, x2), k512, x3));
  const __m128i k128 = constants128(fold_128);
  __m128i piece = load128(pieces);
  for (int i = 1; i < 4; ++i) piece = fold(piece, k128, load128(pieces + 16 * i));
  return finish(piece, byte, bytes);
}

#undef HPCTRAIN_CLMUL128
#undef HPCTRAIN_CLMUL256
#undef HPCTRAIN_CLMUL512

#endif  // __x86_64__

Crc32Kernel fastest_kernel() {
  for (Crc32Kernel kernel : {Crc32Kernel::clmul512, Crc32Kernel::clmul256, Crc32Kernel::clmul128})
    if (crc32_kernel_available(kernel)) return kernel;
  return Crc32Kernel::zlib;
}

std::uint32_t run_kernel(Crc32Kernel kernel, std::uint32_t crc, const unsigned char* byte, std::size_t bytes) {
  switch (kernel) {
#if defined(__x86_64__)
    case Crc32Kernel::clmul512:
      return crc32_clmul512(crc, byte, bytes);
    case Crc32Kernel::clmul256:
      return crc32_clmul256(crc, byte, bytes);
    case Crc32Kernel::clmul128:
      return crc32_clmul128(crc, byte, bytes);
#endif
    default:
      return zlib_crc32(crc, byte, bytes);
  }
}

}  // namespace

bool crc32_kernel_available(Crc32Kernel kernel) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  switch (kernel) {
    case Crc32Kernel::clmul512:
      return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
    case Crc32Kernel::clmul256:
      return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq");
    case Crc32Kernel::clmul128:
      return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    case Crc32Kernel::zlib:
      return true;
  }
  return false;
#else
  return kernel == Crc32Kernel::zlib;
#endif
}

std::uint32_t crc32_with(Crc32Kernel kernel, const void* data, std::size_t bytes, std::uint32_t crc) {
  if (!crc32_kernel_available(kernel)) throw std::invalid_argument("this CPU cannot run the CRC-32 kernel asked for");
  return run_kernel(kernel, crc, static_cast<const unsigned char*>(data), bytes);
}

std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc) {
  static const Crc32Kernel kernel = fastest_kernel();
  return run_kernel(kernel, crc, static_cast<const unsigned char*>(data), bytes);
}

std::uint32_t crc32_parallel(const void* data, std::size_t bytes, std::uint32_t crc) {
  constexpr std::size_t piece = std::size_t{1} << 20;
  const auto pieces = static_cast<std::int64_t>((bytes + piece - 1) / piece);
  if (pieces < 2 || omp_in_parallel() != 0 || omp_get_max_threads() == 1) return crc32(data, bytes, crc);
  const auto* byte = static_cast<const unsigned char*>(data);
  const auto length = [&](std::int64_t p) { return std::min(piece, bytes - static_cast<std::size_t>(p) * piece); };
  std::vector<std::uint32_t> crcs(static_cast<std::size_t>(pieces));
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < pieces; ++p)
    crcs[static_cast<std::size_t>(p)] = crc32(byte + static_cast<std::size_t>(p) * piece, length(p));
  for (std::int64_t p = 0; p < pieces; ++p)
    crc = static_cast<std::uint32_t>(
        crc32_combine(crc, crcs[static_cast<std::size_t>(p)], static_cast<z_off_t>(length(p))));
  return crc;
}

}  // namespace hpctrain
