// allgather_parts on every rank count: parts of unequal length (one of them empty) end up on every rank, exactly,
// through one MPI_Allgatherv and through the piecewise broadcasts it uses for vectors beyond MPI's int counts (forced
// here with a small piece limit). Elements outside the parts stay as they were.
#include "hpctrain/dist/part_exchange.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace hpctrain {
namespace {

float value_at(std::int64_t i) { return std::sin(static_cast<float>(i) * 0.37f) * 1000.0f + 0.25f; }

TEST(AllgatherParts, EveryRankGetsEveryPart) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  // Part p has 3p + 5 elements, except part 1 (empty where it exists); the vector starts at element 4.
  std::vector<std::int64_t> bounds = {4};
  for (int p = 0; p < ranks; ++p) bounds.push_back(bounds.back() + (p == 1 ? 0 : 3 * p + 5));
  const std::int64_t size = bounds.back() + 3;
  for (const std::int64_t max_elements : {std::int64_t{INT32_MAX}, std::int64_t{7}, std::int64_t{1}}) {
    std::vector<float> values(static_cast<std::size_t>(size), std::numeric_limits<float>::quiet_NaN());
    for (std::int64_t i = bounds[static_cast<std::size_t>(rank)]; i < bounds[static_cast<std::size_t>(rank) + 1]; ++i)
      values[static_cast<std::size_t>(i)] = value_at(i);
    allgather_parts(values.data(), bounds, MPI_COMM_WORLD, max_elements);
    for (std::int64_t i = 0; i < size; ++i) {
      const bool inside = i >= bounds.front() && i < bounds.back();
      if (inside)
        ASSERT_EQ(values[static_cast<std::size_t>(i)], value_at(i)) << "element " << i << ", pieces " << max_elements;
      else
        ASSERT_TRUE(std::isnan(values[static_cast<std::size_t>(i)])) << "element " << i << " outside the parts";
    }
  }
}

}  // namespace
}  // namespace hpctrain
