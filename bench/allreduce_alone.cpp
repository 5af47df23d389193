// allreduce_alone: the communication limit of a training step, the MPI all-reduce of the step's gradient bytes
// measured alone (no computation beside it), in the buckets hpctrain cuts (bench/run.sh's roofline table).
//
//   mpiexec -n 2 allreduce_alone --widths 1024,2048,2048,10 [--repeats 30] [--warmup 5]
//
// Each repeat all-reduces (sum, in place, fp32) the buckets of a buffer of N floats with MPI_Iallreduce started
// together and one MPI_Waitall, after a barrier; rank 0 prints the median time over the repeats, in one
// machine-readable line:
//   ALLREDUCE ranks=2 parameters=N buckets=B bytes=... seconds=...
// The buckets are hpctrain's own for an MLP of those widths (gradient_buckets with mpi_bucket_bytes at the linear
// layers' boundaries, each layer's weight then bias, as the CPU backend lays them out).
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "hpctrain/dist/gradient_allreduce.hpp"

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

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
  const auto buckets = hpctrain::gradient_buckets(parameters, layer_begins, hpctrain::mpi_bucket_bytes(parameters));
  std::vector<float> gradients(static_cast<std::size_t>(parameters), 1.0f);
  std::vector<MPI_Request> requests(buckets.size(), MPI_REQUEST_NULL);
  std::vector<double> seconds;
  for (int repeat = 0; repeat < warmup + repeats; ++repeat) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (std::size_t b = 0; b < buckets.size(); ++b)
      MPI_Iallreduce(MPI_IN_PLACE, gradients.data() + buckets[b].begin,
                     static_cast<int>(buckets[b].end - buckets[b].begin), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                     &requests[b]);
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    const double elapsed = MPI_Wtime() - start;
    double slowest = 0.0;  // a collective ends when its slowest rank does
    MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (repeat >= warmup) seconds.push_back(slowest);
    std::fill(gradients.begin(), gradients.end(), 1.0f);  // keep the values finite and the traffic the same
  }
  if (rank == 0)
    std::printf("ALLREDUCE ranks=%d parameters=%lld buckets=%zu bytes=%lld seconds=%.6g\n", ranks,
                static_cast<long long>(parameters), buckets.size(),
                static_cast<long long>(parameters * static_cast<std::int64_t>(sizeof(float))), median(seconds));
  MPI_Finalize();
  return 0;
}
