// allgather_parts: MPI_Allgatherv, or broadcasts in pieces where MPI's int counts cannot hold the sizes.
#include "hpctrain/dist/part_exchange.hpp"

#include <algorithm>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

void allgather_parts(void* values, std::size_t element_bytes, const std::vector<std::int64_t>& bounds, MPI_Comm comm,
                     std::int64_t max_elements) {
  HPCTRAIN_ASSERT(element_bytes == 1 || element_bytes == 2 || element_bytes == 4 || element_bytes == 8,
                  "allgather_parts: elements of " << element_bytes << " bytes");
  // Unsigned integers of the element's size: MPI moves every bit pattern unchanged.
  const MPI_Datatype type = element_bytes == 1   ? MPI_UINT8_T
                            : element_bytes == 2 ? MPI_UINT16_T
                            : element_bytes == 4 ? MPI_UINT32_T
                                                 : MPI_UINT64_T;
  auto* const bytes = static_cast<char*>(values);
  const auto at = [&](std::int64_t element) { return bytes + element * static_cast<std::int64_t>(element_bytes); };
  int ranks = 1;
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(comm, &ranks));
  HPCTRAIN_ASSERT(bounds.size() == static_cast<std::size_t>(ranks) + 1 && max_elements > 0,
                  bounds.size() << " bounds for " << ranks << " ranks");
  if (ranks == 1) return;
  const std::int64_t base = bounds.front();
  if (bounds.back() - base <= max_elements) {  // every count and offset fits
    std::vector<int> counts(static_cast<std::size_t>(ranks)), offsets(counts.size());
    for (std::size_t p = 0; p < counts.size(); ++p) {
      counts[p] = static_cast<int>(bounds[p + 1] - bounds[p]);
      offsets[p] = static_cast<int>(bounds[p] - base);
    }
    HPCTRAIN_MPI_CHECK(
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, at(base), counts.data(), offsets.data(), type, comm));
    return;
  }
  for (int p = 0; p < ranks; ++p)
    for (std::int64_t first = bounds[static_cast<std::size_t>(p)]; first < bounds[static_cast<std::size_t>(p) + 1];
         first += max_elements) {
      const std::int64_t count = std::min(max_elements, bounds[static_cast<std::size_t>(p) + 1] - first);
      HPCTRAIN_MPI_CHECK(MPI_Bcast(at(first), static_cast<int>(count), type, p, comm));
    }
}

}  // namespace hpctrain
