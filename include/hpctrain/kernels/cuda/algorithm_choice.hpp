// Which of cuDNN's heuristic results a convolution plan takes, as a pure function of the results (host-only, tested on
// the CPU with made-up result lists in tests/unit/cuda_host_logic_test.cpp).
//
// The heuristic lists algorithms best first. Deterministic ones are preferred (two identical runs must give identical
// bits), but only within a workspace cap: a deterministic algorithm can ask for gigabytes, and taking it would either
// fail the allocation or starve the rest of the run. When no deterministic algorithm fits, the first one that fits is
// taken and the choice says so, for the log.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace hpctrain::cuda {

struct AlgorithmCandidate {
  int algorithm = 0;       // cuDNN's enum value (for the log)
  bool available = false;  // status == CUDNN_STATUS_SUCCESS
  bool precise = false;    // its math keeps the storage's precision (no TF32 for strict fp32, no fp16 down-cast)
  bool deterministic = false;
  std::size_t workspace_bytes = 0;
};

struct AlgorithmChoice {
  int index = -1;  // into the candidate list; -1: nothing usable
  bool deterministic = false;
  bool deterministic_over_cap = false;  // a deterministic algorithm existed but wanted more than the cap
};

// Workspace cap for one convolution: an eighth of the device memory free when the plan is made, within [64 MiB, 1 GiB].
inline std::size_t convolution_workspace_cap(std::size_t free_device_bytes) {
  constexpr std::size_t floor = std::size_t{64} << 20, ceiling = std::size_t{1} << 30;
  const std::size_t eighth = free_device_bytes / 8;
  return eighth < floor ? floor : (eighth > ceiling ? ceiling : eighth);
}

// only_algorithm >= 0: consider that algorithm only (a fused operation that cuDNN runs with one algorithm: the
// convolution with its bias needs IMPLICIT_PRECOMP_GEMM); index -1 when the heuristic did not offer it usable.
inline AlgorithmChoice choose_algorithm(const std::vector<AlgorithmCandidate>& candidates, std::size_t workspace_cap,
                                        int only_algorithm = -1) {
  AlgorithmChoice choice;
  for (const bool need_deterministic : {true, false})
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const AlgorithmCandidate& c = candidates[i];
      if (only_algorithm >= 0 && c.algorithm != only_algorithm) continue;
      if (!c.available || !c.precise || (need_deterministic && !c.deterministic)) continue;
      if (c.workspace_bytes > workspace_cap) {
        choice.deterministic_over_cap = choice.deterministic_over_cap || c.deterministic;
        continue;
      }
      choice.index = static_cast<int>(i);
      choice.deterministic = c.deterministic;
      return choice;
    }
  return choice;
}

// The usual choice, or `preferred` (an algorithm a fused operation needs) when it is usable and gives up nothing: it
// must be deterministic whenever the usual choice is. preferred_taken says which.
struct PreferredChoice {
  AlgorithmChoice choice;
  bool preferred_taken = false;
};
inline PreferredChoice choose_algorithm_preferring(const std::vector<AlgorithmCandidate>& candidates,
                                                   std::size_t workspace_cap, int preferred) {
  const AlgorithmChoice usual = choose_algorithm(candidates, workspace_cap);
  const AlgorithmChoice fused = choose_algorithm(candidates, workspace_cap, preferred);
  if (fused.index >= 0 && (fused.deterministic || !usual.deterministic)) return {fused, true};
  return {usual, false};
}

}  // namespace hpctrain::cuda
