// row_copy_ceiling: what a bare copy of random rows out of a cached file reaches on this machine, the limit of
// 'hpctrain data bench' with a global shuffle (bench/data_pipeline.sh runs it on as many ranks).
//
//   mpiexec -n R row_copy_ceiling FILE --row-bytes B [--batch 256] [--epochs 5] [--seed 1]
//
// The file is taken as rows of B bytes from its start (where they lie does not matter to a ceiling). Each epoch
// shuffles all rows (std::shuffle, a seed per epoch), and after a barrier rank r copies every R-th of them from r on,
// in batches of batch / R rows, into one batch buffer, with memcpy and the rows prefetched into the level-2 cache about
// 8 KiB ahead as hpctrain does: no sampler, no loader, no guards. The first epoch runs on a fresh map of the file, so
// it includes building this process's page tables for it (a page fault per 16 pages, as hpctrain's first epoch does);
// the later ones do not. Rank 0 prints one machine-readable line, the medians over the ranks of each rank's figures
// (MB/s):
//   ROWCOPY ranks=R first_epoch_mbps=... later_epochs_mbps=...   (a rank's later figure: its median over epochs 2..E)
#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "median_time.hpp"
namespace {

using hpctrain::bench::median;

long long option(int argc, char** argv, const char* name, long long fallback) {
  for (int i = 2; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

[[noreturn]] void fail(const char* message) {
  std::fprintf(stderr, "row_copy_ceiling: %s\n", message);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank_number = 0, rank_count = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_number);
  MPI_Comm_size(MPI_COMM_WORLD, &rank_count);
  if (argc < 4) fail("usage: mpiexec -n R row_copy_ceiling FILE --row-bytes B [--batch 256] [--epochs 5]");
  const auto row_bytes = static_cast<std::size_t>(option(argc, argv, "--row-bytes", 0));
  const auto batch = static_cast<std::size_t>(option(argc, argv, "--batch", 256));
  const int epochs = static_cast<int>(option(argc, argv, "--epochs", 5));
  const auto seed = static_cast<std::uint64_t>(option(argc, argv, "--seed", 1));
  const auto rank = static_cast<std::size_t>(rank_number), ranks = static_cast<std::size_t>(rank_count);
  const int descriptor = open(argv[1], O_RDONLY);
  struct stat status {};
  if (descriptor < 0 || fstat(descriptor, &status) != 0) fail("cannot open the file");
  if (row_bytes == 0 || batch < ranks || epochs < 2) fail("--row-bytes > 0, --batch >= ranks and --epochs >= 2");
  const auto file_bytes = static_cast<std::size_t>(status.st_size);
  const std::size_t rows = file_bytes / row_bytes, local_batch = batch / ranks;
  const auto* map = static_cast<const unsigned char*>(mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, descriptor, 0));
  if (map == MAP_FAILED || rows < batch) fail("cannot map the file, or it holds less than a batch of rows");

  std::vector<unsigned char> buffer(local_batch * row_bytes);
  const std::size_t rows_ahead = std::clamp<std::size_t>(8192 / row_bytes, 1, 32);
  const std::size_t prefetched = std::min<std::size_t>(row_bytes, 8192);
  std::vector<std::size_t> order(rows), mine;
  std::vector<double> rates;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937_64 generator(seed + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), generator);
    mine.clear();
    for (std::size_t i = rank; i < rows; i += ranks) mine.push_back(order[i]);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t first = 0; first + local_batch <= mine.size(); first += local_batch) {
      for (std::size_t i = 0; i < local_batch; ++i) {
        if (i + rows_ahead < local_batch) {
          const unsigned char* next = map + mine[first + i + rows_ahead] * row_bytes;
          for (std::size_t byte = 0; byte < prefetched; byte += 64) __builtin_prefetch(next + byte, 0, 2);
        }
        std::memcpy(buffer.data() + i * row_bytes, map + mine[first + i] * row_bytes, row_bytes);
      }
    }
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    const double copied = static_cast<double>(mine.size() / local_batch * local_batch * row_bytes);
    rates.push_back(copied / seconds.count() / 1e6);
  }

  const double figures[2] = {rates.front(), median(std::vector<double>(rates.begin() + 1, rates.end()))};
  std::vector<double> all(2 * ranks);
  MPI_Gather(figures, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  std::vector<double> first(ranks), later(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    first[r] = all[2 * r];
    later[r] = all[2 * r + 1];
  }
  // The byte printed last keeps the compiler from dropping copies nobody reads.
  if (rank == 0)
    std::printf("ROWCOPY ranks=%zu first_epoch_mbps=%.1f later_epochs_mbps=%.1f (byte %u)\n", ranks, median(first),
                median(later), static_cast<unsigned>(buffer[buffer.size() / 2]));
  MPI_Finalize();
  return 0;
}
