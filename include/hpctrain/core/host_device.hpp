// HPCTRAIN_HD marks small arithmetic functions that both the host compiler and nvcc compile, so the arithmetic the GPU
// runs is the arithmetic the CPU tests check on every CI run.
#pragma once

#if defined(__CUDACC__)
#define HPCTRAIN_HD __host__ __device__ __forceinline__
#else
#define HPCTRAIN_HD inline
#endif
