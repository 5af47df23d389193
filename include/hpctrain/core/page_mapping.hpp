// How the kernel maps a region of this process: its resident bytes and how many of them sit in 2 MiB page-table
// entries (a file's large page-cache folios, or transparent huge pages), from /proc/self/smaps. For reports only:
// random reads of a mapped file are several times faster when its pages are mapped 2 MiB at a time (docs/data.md).
#pragma once

#include <cstdint>
#include <optional>

namespace hpctrain {

struct PageMapping {
  std::uint64_t resident_bytes = 0;  // Rss
  std::uint64_t huge_bytes = 0;      // FilePmdMapped + AnonHugePages + ShmemPmdMapped
};

// The mapping that starts at `start` (an address mmap returned), or nothing where there is none or /proc/self/smaps
// cannot be read (not Linux, /proc not mounted).
std::optional<PageMapping> page_mapping(const void* start);

}  // namespace hpctrain
