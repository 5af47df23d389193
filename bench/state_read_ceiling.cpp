// state_read_ceiling: the floor of a checkpoint read on R ranks (bench/checkpoint_bandwidth.sh runs it beside
// hpctrain's reads). The training state is replicated: after a read every rank holds all of it. So here every rank
// reads the whole cached file into memory it has already touched, in 1 MiB pieces on its OpenMP threads, with no
// gather, no checksum and no HDF5: the least a read can do. Two ways, alternating: preads straight into that memory,
// and preads through a cache-sized buffer with streaming stores into it (core/copy_bytes.hpp's read_at_streaming,
// which skips reading the destination's lines first); the bound is the faster. A cached `dd` to /dev/null reuses one
// 4 MiB buffer that stays in cache, so it is faster than any reader that has to fill memory.
//
//   OMP_NUM_THREADS=T mpiexec -n R state_read_ceiling FILE [--repeats 3]
//
// Each repeat starts after a barrier and lasts until the slowest rank is done; rank 0 prints the medians over the
// repeats, machine-readable (seconds: the faster way's):
//   STATEREAD ranks=R bytes=N seconds=S direct_seconds=D streamed_seconds=T
#include <fcntl.h>
#include <mpi.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "hpctrain/core/copy_bytes.hpp"
#include "median_time.hpp"

namespace {

[[noreturn]] void fail(const char* message) {
  std::fprintf(stderr, "state_read_ceiling: %s\n", message);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 2 && !(argc == 4 && std::strcmp(argv[2], "--repeats") == 0))
    fail("usage: mpiexec -n R state_read_ceiling FILE [--repeats 3]");
  const int repeats = argc == 4 ? std::atoi(argv[3]) : 3;
  const int descriptor = open(argv[1], O_RDONLY);
  struct stat status {};
  if (descriptor < 0 || fstat(descriptor, &status) != 0 || status.st_size <= 0) fail("cannot read the file");
  if (repeats < 1) fail("--repeats must be at least 1");
  const auto bytes = static_cast<std::size_t>(status.st_size);
  constexpr std::size_t piece = std::size_t{1} << 20;
  const auto pieces = static_cast<long>((bytes + piece - 1) / piece);
  // Touched (a rank's state exists before it is read into) and page-aligned like the file's pieces: the kernel's copy
  // crawls when the destination lies 1-31 bytes past the source modulo 4 KiB (core/copy_bytes.hpp), which a plain
  // malloc'd buffer (16 bytes past a page) would hit on every piece.
  const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
  std::unique_ptr<char, decltype(&std::free)> owner(static_cast<char*>(std::aligned_alloc(4096, rounded)), &std::free);
  if (!owner) fail("cannot allocate a buffer as large as the file");
  char* const memory = owner.get();
  std::memset(memory, 1, rounded);

  std::vector<double> times[2];  // direct, streamed
  for (int repeat = 0; repeat < repeats; ++repeat) {
    for (int streamed = 0; streamed < 2; ++streamed) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
      for (long p = 0; p < pieces; ++p) {
        const std::size_t offset = static_cast<std::size_t>(p) * piece, length = std::min(piece, bytes - offset);
        if (streamed != 0) {
          failed |= hpctrain::read_at_streaming(descriptor, memory + offset, length, offset, {}) != 0 ? 1 : 0;
          continue;
        }
        std::size_t done = 0;
        while (done < length) {
          const ssize_t got =
              pread(descriptor, memory + offset + done, length - done, static_cast<off_t>(offset + done));
          if (got > 0) {
            done += static_cast<std::size_t>(got);
          } else if (!(got < 0 && errno == EINTR)) {
            failed = 1;
            break;
          }
        }
      }
      if (failed != 0) fail("a read failed");
      double seconds = MPI_Wtime() - start;
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      times[streamed].push_back(seconds);
    }
  }
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const double direct = hpctrain::bench::median(times[0]), streamed = hpctrain::bench::median(times[1]);
  if (rank == 0)
    std::printf("STATEREAD ranks=%d bytes=%zu seconds=%.6f direct_seconds=%.6f streamed_seconds=%.6f (byte %d)\n",
                ranks, bytes, std::min(direct, streamed), direct, streamed, static_cast<int>(memory[bytes / 2]));
  MPI_Finalize();
  return 0;
}
