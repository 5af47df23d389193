// Collective output files: write through MPI-IO in agreed steps, then commit, or clean up with one message.
#include "hpctrain/io/parallel_file.hpp"

#include <cerrno>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/io/checkpoint_phases.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

namespace {

// How long a rank whose write failed waits for the others to agree before it ends the job on its own.
constexpr double failed_rank_patience_seconds = 60.0;

// Failure codes for the agreement, larger for causes that say more: the rank that knows most reports.
constexpr int failed_on_another_rank = 1;
constexpr int failed_for_other_reasons = 2;
constexpr int errors_by_code[] = {0, 0, 0, EFBIG, EDQUOT, ENOSPC};

// What went wrong on this rank.
struct LocalFailure {
  int code = 0;
  std::string detail;  // the library's words, without its call text
};

LocalFailure failure_of(const LibraryError& error) {
  int code = failed_for_other_reasons;
  for (int candidate = 3; candidate < static_cast<int>(std::size(errors_by_code)); ++candidate)
    if (errors_by_code[candidate] == error.error_number()) code = candidate;
  return {code, error.detail().empty() ? error.what() : error.detail()};
}

// Thrown on every rank by a step that failed somewhere; `abandoned` when this rank failed and the others did not
// arrive to agree (one of them is stuck in a collective call).
class CollectiveWriteFailure : public Error {
 public:
  CollectiveWriteFailure(LocalFailure failure, bool abandoned)
      : Error(failure.detail), failure_(std::move(failure)), abandoned_(abandoned) {}
  [[nodiscard]] const LocalFailure& failure() const { return failure_; }
  [[nodiscard]] bool abandoned() const { return abandoned_; }

 private:
  LocalFailure failure_;
  bool abandoned_;
};

LocalFailure run_capturing_failure(const std::function<void()>& action) {
  try {
    action();
  } catch (const CollectiveWriteFailure&) {
    throw;
  } catch (const LibraryError& error) {
    return failure_of(error);
  } catch (const Error& error) {
    return {failed_for_other_reasons, error.what()};
  }
  return {};
}

std::string failure_message(const CollectiveWrite& request, int code, const std::string& detail) {
  std::string message = "writing " + request.description + " '" + request.destination.string() + "' failed: " +
                        write_failure_reason(errors_by_code[code], detail, request.destination, request.expected_bytes,
                                             "the " + request.description);
  return request.consequence.empty() ? message : message + "; " + request.consequence;
}

// `text` of rank `root` on every rank (collective).
void broadcast_from(const MpiEnvironment& mpi, int root, std::string& text) {
  long long length = static_cast<long long>(text.size());
  HPCTRAIN_MPI_CHECK(MPI_Bcast(&length, 1, MPI_LONG_LONG, root, mpi.world()));
  text.resize(static_cast<std::size_t>(length));
  HPCTRAIN_MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, root, mpi.world()));
}

// Closes a file whose write failed (closing is collective: only where every rank still holds it open). Rank 0 first
// cuts the file to nothing: a full disk then has room for the metadata the close writes. A file left open, or a close
// that failed, leaves HDF5 unable to shut down cleanly (mark_shutdown_unsafe).
void close_after_failure(H5Handle& file, const fs::path& partial, const MpiEnvironment& mpi) {
  int open[2] = {file.valid() ? 1 : 0, file.valid() ? 0 : 1};  // maxima: open on some rank, closed on some rank
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, open, 2, MPI_INT, MPI_MAX, mpi.world()));
  if (open[0] == 0) return;
  if (mpi.is_root()) {
    std::error_code ignored;
    fs::resize_file(partial, 0, ignored);
  }
  HPCTRAIN_MPI_CHECK(MPI_Barrier(mpi.world()));
  const hid_t id = file.release();
  int closed = open[1] == 0 && H5Fclose(id) >= 0 ? 1 : 0;
  H5Eclear2(H5E_DEFAULT);
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &closed, 1, MPI_INT, MPI_MIN, mpi.world()));
  if (closed == 0) mark_shutdown_unsafe();
}

}  // namespace

void write_step_collectively(const MpiEnvironment& mpi, const std::function<void()>& step) {
  LocalFailure failure = run_capturing_failure(step);
  const CheckpointPhaseScope phase(CheckpointPhase::agree);
  const auto agreed = agree_on_failure(mpi, failure.code, failed_rank_patience_seconds);
  if (!agreed) throw CollectiveWriteFailure(std::move(failure), true);
  if (agreed->failure == 0) return;
  if (failure.code == 0) failure.code = failed_on_another_rank;
  throw CollectiveWriteFailure(std::move(failure), false);
}

void write_file_collectively(const CollectiveWrite& request, const MpiEnvironment& mpi,
                             const std::function<void(hid_t file, hid_t transfer)>& write) {
  const fs::path partial = partial_path(request.destination);
  const auto lock = lock_hdf5();
  H5Handle file;
  LocalFailure failure;
  try {
    write_step_collectively(mpi, [&] {
      const CheckpointPhaseScope phase(CheckpointPhase::create_open);
      file = create_file_collectively(partial.string(), mpi.world());
    });
    H5Handle transfer = collective_transfer(mpi.world());
    failure = run_capturing_failure([&] { write(file.get(), transfer.get()); });
    // The close is collective and writes the last metadata, so a full disk may show only here.
    if (failure.code == 0)
      write_step_collectively(mpi, [&] {
        const CheckpointPhaseScope phase(CheckpointPhase::close);
        file.close();
      });
  } catch (const CollectiveWriteFailure& error) {
    failure = error.failure();
    if (error.abandoned()) {
      // Another rank is stuck in a collective call this one left: closing (collective too) would hang. The job ends.
      file.release();
      mark_shutdown_unsafe();
      std::error_code ignored;
      fs::remove(partial, ignored);
      throw Error(failure_message(request, failure.code, failure.detail), ErrorScope::this_rank, request.hint);
    }
  }
  // Every rank arrives here at once after a failed step; a failure outside a step may leave others in a collective.
  const auto agreed = agree_on_failure(mpi, failure.code, failed_rank_patience_seconds);
  if (!agreed) {
    file.release();
    mark_shutdown_unsafe();
    throw Error(failure_message(request, failure.code, failure.detail), ErrorScope::this_rank, request.hint);
  }
  if (agreed->failure != 0) {
    close_after_failure(file, partial, mpi);
    broadcast_from(mpi, agreed->rank, failure.detail);
    run_on_root(mpi, [&] {
      std::error_code ignored;
      fs::remove(partial, ignored);
      throw Error(failure_message(request, agreed->failure, failure.detail), ErrorScope::all_ranks, request.hint);
    });
  }
  run_on_root(mpi, [&] {
    const CheckpointPhaseScope phase(CheckpointPhase::commit);
    commit_file(partial, request.destination, request.companions);
  });
}

}  // namespace hpctrain
