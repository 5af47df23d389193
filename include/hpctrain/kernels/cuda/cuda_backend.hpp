// What code outside the kernels needs to know about a CUDA backend: its device and its stream, so that NCCL
// communication and CUDA graphs can be ordered against the compute work. CUDA-only header.
#pragma once

#include <cuda_runtime.h>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

// The stream every kernel of `backend` runs on. backend must be a CUDA backend (InternalError otherwise).
cudaStream_t cuda_stream_of(Backend& backend);
// The device index of `backend`.
int cuda_device_of(Backend& backend);

}  // namespace hpctrain
