// allgather_parts: MPI_Allgatherv, or broadcasts in pieces where MPI's int counts cannot hold the sizes.
#include "hpctrain/dist/part_exchange.hpp"

#include <algorithm>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

void allgather_parts(float* values, const std::vector<std::int64_t>& bounds, MPI_Comm comm, std::int64_t max_elements) {
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
    HPCTRAIN_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values + base, counts.data(), offsets.data(),
                                      MPI_FLOAT, comm));
    return;
  }
  for (int p = 0; p < ranks; ++p)
    for (std::int64_t first = bounds[static_cast<std::size_t>(p)]; first < bounds[static_cast<std::size_t>(p) + 1];
         first += max_elements) {
      const std::int64_t count = std::min(max_elements, bounds[static_cast<std::size_t>(p) + 1] - first);
      HPCTRAIN_MPI_CHECK(MPI_Bcast(values + first, static_cast<int>(count), MPI_FLOAT, p, comm));
    }
}

}  // namespace hpctrain
