// Evaluation counts and predict's per-row scores on the CPU backend (cpu_class_hits.cpp). Private to src/kernels/cpu.
#pragma once

#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cpu {

// The contract of Backend::count_class_hits.
void count_class_hits(const TensorView& scores, const std::int32_t* targets, double* counts, bool accumulate);
// The contract of Backend::score_targets.
void score_targets(const TensorView& logits, const std::int32_t* targets, std::int32_t* argmax,
                   float* target_log_probability);

}  // namespace hpctrain::cpu
