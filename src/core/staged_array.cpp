// allocate_staged_bytes: aligned_alloc, 2 MiB-aligned and advised MADV_HUGEPAGE where huge pages are asked for.
#include "hpctrain/core/staged_array.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>

namespace hpctrain {

void* allocate_staged_bytes(std::size_t bytes, bool huge_pages) {
  constexpr std::size_t line = 64, huge_page = std::size_t{2} << 20;
  const std::size_t alignment = huge_pages ? huge_page : line;
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);  // needs a size that is a multiple of the alignment
  if (memory == nullptr) throw std::bad_alloc();
  // Advice only: a kernel without transparent huge pages refuses it (EINVAL), and the memory works the same.
  if (huge_pages) (void)madvise(memory, rounded, MADV_HUGEPAGE);
  return memory;
}

}  // namespace hpctrain
