// Assembling a vector whose parts lie on different ranks: every rank ends with all of it.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hpctrain {

// In place: rank p of `comm` holds values[bounds[p], bounds[p + 1]) and every rank ends with values[bounds.front(),
// bounds.back()) (bounds: one more entry than `comm` has ranks, non-decreasing). One MPI_Allgatherv where every count
// and offset fits in `max_elements` (an int: MPI's counts); otherwise, for vectors of 2^31 elements and more, one
// broadcast per part and piece of at most `max_elements`. Collective over `comm`.
// Elements of 1, 2, 4 or 8 bytes travel as unsigned integers of that size: every bit pattern arrives unchanged.
void allgather_parts(void* values, std::size_t element_bytes, const std::vector<std::int64_t>& bounds, MPI_Comm comm,
                     std::int64_t max_elements = INT_MAX);
inline void allgather_parts(float* values, const std::vector<std::int64_t>& bounds, MPI_Comm comm,
                            std::int64_t max_elements = INT_MAX) {
  allgather_parts(values, sizeof(float), bounds, comm, max_elements);
}

}  // namespace hpctrain
