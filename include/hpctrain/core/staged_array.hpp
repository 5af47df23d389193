// Uninitialised arrays for data written once and then read at random for the whole run (data staged in memory), on
// huge pages where asked.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace hpctrain {

struct FreeBytes {
  void operator()(void* bytes) const noexcept { std::free(bytes); }
};

template <class T>
using StagedArray = std::unique_ptr<T[], FreeBytes>;

// `bytes` uninitialised bytes (at least one), 64-byte aligned. With huge_pages they are 2 MiB-aligned and advised
// MADV_HUGEPAGE (transparent huge pages): the first touch then faults once per 2 MiB instead of per 4 KiB, and random
// reads miss the TLB far less. The kernel may still give 4 KiB pages (no free huge page, THP off); where its `defrag`
// setting is `madvise` or `always` it first compacts or reclaims memory for them, which can stall a busy node.
// Throws std::bad_alloc.
void* allocate_staged_bytes(std::size_t bytes, bool huge_pages);

template <class T>
StagedArray<T> allocate_staged_array(std::size_t count, bool huge_pages) {
  return StagedArray<T>(static_cast<T*>(allocate_staged_bytes(count * sizeof(T), huge_pages)));
}

}  // namespace hpctrain
