// allreduce_alone: the communication limit of a training step, the all-reduce of the step's gradient bytes measured
// alone (no computation beside it), in the buckets hpctrain cuts (bench/run.sh's roofline table).
//
//   mpiexec -n 2 allreduce_alone --widths 1024,2048,2048,10 [--repeats 30] [--warmup 5]
//
// Each repeat all-reduces (sum, in place, fp32) the buckets of a buffer of N floats through hpctrain's
// GradientAllreduce, every bucket started at once and then finished, after a barrier; both algorithms
// (HPCTRAIN_MPI_ALLREDUCE's rank-order and library) alternate repeat by repeat. Rank 0 prints each algorithm's median
// time over the repeats, one machine-readable line each:
//   ALLREDUCE algorithm=rank-order ranks=2 parameters=N buckets=B bytes=... seconds=...
// The buckets are hpctrain's own for an MLP of those widths (gradient_buckets with mpi_bucket_bytes at the linear
// layers' boundaries, each layer's weight then bias, as the CPU backend lays them out).
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "hpctrain/dist/gradient_allreduce.hpp"
#include "median_time.hpp"

namespace {

using hpctrain::bench::median;

long long option(int argc, char** argv, const char* name, long long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::vector<std::int64_t> widths, layer_begins;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--widths") == 0) {
      std::stringstream list(argv[i + 1]);
      for (std::string width; std::getline(list, width, ',');) widths.push_back(std::atoll(width.c_str()));
    }
  std::int64_t parameters = 0;
  for (std::size_t layer = 1; layer < widths.size(); ++layer) {
    layer_begins.push_back(parameters);
    parameters += widths[layer] * (widths[layer - 1] + 1);
  }
  const int repeats = static_cast<int>(option(argc, argv, "--repeats", 30));
  const int warmup = static_cast<int>(option(argc, argv, "--warmup", 5));
  if (widths.size() < 2 || parameters <= 0 || repeats <= 0) {
    if (rank == 0) std::fprintf(stderr, "usage: allreduce_alone --widths W0,W1,... [--repeats R] [--warmup W]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const std::int64_t bucket_bytes = hpctrain::mpi_bucket_bytes(parameters);
  std::vector<float> gradients(static_cast<std::size_t>(parameters), 1.0f);
  const hpctrain::MpiAllreduce algorithms[] = {hpctrain::MpiAllreduce::rank_order, hpctrain::MpiAllreduce::library};
  std::vector<std::unique_ptr<hpctrain::GradientAllreduce>> exchanges;
  for (const auto algorithm : algorithms)
    exchanges.push_back(std::make_unique<hpctrain::GradientAllreduce>(
        MPI_COMM_WORLD, gradients.data(), parameters, layer_begins, bucket_bytes,
        hpctrain::MpiExchangeSettings{.algorithm = algorithm}));
  std::vector<std::vector<double>> seconds(exchanges.size());
  for (int repeat = 0; repeat < warmup + repeats; ++repeat)
    for (std::size_t which = 0; which < exchanges.size(); ++which) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      exchanges[which]->begin_step();
      exchanges[which]->ready_from(0);
      exchanges[which]->finish();
      const double elapsed = MPI_Wtime() - start;
      double slowest = 0.0;  // a collective ends when its slowest rank does
      MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (repeat >= warmup) seconds[which].push_back(slowest);
      std::fill(gradients.begin(), gradients.end(), 1.0f);  // keep the values finite and the traffic the same
    }
  if (rank == 0)
    for (std::size_t which = 0; which < exchanges.size(); ++which)
      std::printf(
          "ALLREDUCE algorithm=%s ranks=%d parameters=%lld buckets=%zu bytes=%lld seconds=%.6g\n",
          algorithms[which] == hpctrain::MpiAllreduce::rank_order ? "rank-order" : "library", ranks,
          static_cast<long long>(parameters), hpctrain::gradient_buckets(parameters, layer_begins, bucket_bytes).size(),
          static_cast<long long>(parameters * static_cast<std::int64_t>(sizeof(float))), median(seconds[which]));
  exchanges.clear();  // frees their communicators before MPI_Finalize
  MPI_Finalize();
  return 0;
}
