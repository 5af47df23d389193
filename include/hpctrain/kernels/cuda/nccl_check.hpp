// HPCTRAIN_NCCL_CHECK: a failing NCCL call throws LibraryError with ncclGetErrorString's text (and NCCL's last error
// message) and the file:line of the call. CUDA+NCCL-only header.
#pragma once

#include <nccl.h>

#include "hpctrain/core/error.hpp"

namespace hpctrain::detail {
[[noreturn]] void throw_nccl_error(ncclResult_t code, ncclComm_t communicator, const char* call, const char* file,
                                   int line);
}  // namespace hpctrain::detail

// communicator: the communicator the call used (for ncclGetLastError's detail), or nullptr.
#define HPCTRAIN_NCCL_CHECK_ON(communicator, call)                                                      \
  do {                                                                                                  \
    const ncclResult_t hpctrain_nccl_rc_ = (call);                                                      \
    if (hpctrain_nccl_rc_ != ncclSuccess && hpctrain_nccl_rc_ != ncclInProgress)                        \
      ::hpctrain::detail::throw_nccl_error(hpctrain_nccl_rc_, communicator, #call, __FILE__, __LINE__); \
  } while (false)
#define HPCTRAIN_NCCL_CHECK(call) HPCTRAIN_NCCL_CHECK_ON(nullptr, call)
