// Assembling a vector whose parts lie on different ranks: every rank ends with all of it.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <vector>

namespace hpctrain {

// In place: rank p of `comm` holds values[bounds[p], bounds[p + 1]) and every rank ends with values[bounds.front(),
// bounds.back()) (bounds: one more entry than `comm` has ranks, non-decreasing). One MPI_Allgatherv where every count
// and offset fits in `max_elements` (an int: MPI's counts); otherwise, for vectors of 2^31 elements and more, one
// broadcast per part and piece of at most `max_elements`. Collective over `comm`.
void allgather_parts(float* values, const std::vector<std::int64_t>& bounds, MPI_Comm comm,
                     std::int64_t max_elements = INT_MAX);

}  // namespace hpctrain
