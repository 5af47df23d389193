// How the host waits for device work: query until done, calling a monitor between queries, instead of a blocking
// cudaStreamSynchronize that cannot notice a failed peer. The monitor is NCCL's asynchronous-error check (installed by
// the gradient exchange): it aborts the communicator and throws, so a lost link ends the job instead of hanging it.
// The loop backs off from yielding to short sleeps, so a rank waiting for a long step does not hold a core.
//
// Host-only (no CUDA headers): tested on the CPU with fake queries (tests/unit/cuda_host_logic_test.cpp).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace hpctrain::cuda {

// The pause after `round` unsuccessful queries: yields first (a short wait costs nothing), then sleeps that grow to
// 200 microseconds (the latency a long wait adds is negligible next to the step).
inline std::chrono::microseconds wait_pause(long round) {
  if (round < 64) return std::chrono::microseconds(0);
  if (round < 1024) return std::chrono::microseconds(20);
  return std::chrono::microseconds(200);
}

// done(): true when the awaited work has finished (throws on a device error). monitor(): called between queries (may
// be empty; may throw, which ends the wait with its exception).
inline void wait_polling(const std::function<bool()>& done, const std::function<void()>& monitor) {
  for (long round = 0;; ++round) {
    if (done()) return;
    if (monitor) monitor();
    const auto pause = wait_pause(round);
    if (pause.count() == 0)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(pause);
  }
}

}  // namespace hpctrain::cuda
