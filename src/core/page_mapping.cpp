// /proc/self/smaps: a header line "start-end perms offset dev inode path" per mapping, then "Key:   value kB" lines.
#include "hpctrain/core/page_mapping.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace hpctrain {

std::optional<PageMapping> page_mapping(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return std::nullopt;
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "%lx-", static_cast<unsigned long>(reinterpret_cast<std::uintptr_t>(start)));
  const std::string header(prefix);
  std::optional<PageMapping> found;
  for (std::string line; std::getline(smaps, line);) {
    if (!found) {
      if (line.starts_with(header)) found.emplace();
      continue;
    }
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos || line.find(' ') < colon) break;  // the next mapping's header: done
    const std::string key = line.substr(0, colon);
    const std::uint64_t bytes = std::strtoull(line.c_str() + colon + 1, nullptr, 10) * 1024;  // "  1234 kB"
    if (key == "Rss") found->resident_bytes = bytes;
    if (key == "FilePmdMapped" || key == "AnonHugePages" || key == "ShmemPmdMapped") found->huge_bytes += bytes;
  }
  return found;
}

}  // namespace hpctrain
