// The per-step agreement: flags summed over the ranks (rank 0's clock flags only count from rank 0).
#include "hpctrain/train/run_control.hpp"

#include "hpctrain/core/error.hpp"

namespace hpctrain {

void RunControl::agree(MPI_Comm world) {
  int rank = 0;
  HPCTRAIN_MPI_CHECK(MPI_Comm_rank(world, &rank));
  const bool root = rank == 0;
  int flags[3] = {signal_seen ? 1 : 0, root && clock == ClockRequest::checkpoint ? 1 : 0,
                  root && clock == ClockRequest::checkpoint_and_stop ? 1 : 0};
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flags, 3, MPI_INT, MPI_SUM, world));
  signal_seen = flags[0] > 0;
  clock = flags[2] > 0   ? ClockRequest::checkpoint_and_stop
          : flags[1] > 0 ? ClockRequest::checkpoint
                         : ClockRequest::none;
}

}  // namespace hpctrain
