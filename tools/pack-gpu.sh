#!/usr/bin/env bash
# Builds hpctrain, its CUDA module (libhpctrain_cuda.so) and the GPU test programs for Hopper (sm_90) in build-gpu/ and
# packs them, with the MPI/HDF5/oneDNN runtime they need, into .device/rt.tar.xz for a GPU machine that has CUDA but no
# MPI or HDF5 (see /work/shared/gpu/README.md). tools/gpu-check.sh unpacks and runs it there. pack.sh puts what it is
# given in bin/, so the module lands beside the programs; gpu-check.sh moves it to lib/, where they look for it.
#
#   tools/pack-gpu.sh [OUT.tar.xz]        (JOBS=N for the build's parallelism, default 2)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.device/rt.tar.xz}
pack=${HPCTRAIN_PACK:-$root/../shared/gpu/pack.sh}
[[ -x $pack ]] || pack=/work/shared/gpu/pack.sh
[[ -x $pack ]] || { echo "pack-gpu.sh: pack.sh not found (set HPCTRAIN_PACK)" >&2; exit 2; }
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$root")}

cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=Release -DHPCTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DHPCTRAIN_BENCHMARKS=OFF >/dev/null
tests=(cuda_kernels_test cuda_attention_test cuda_tensor_core_attention_test cuda_paths_test cuda_throughput_test device_allreduce_mpi_test)
cmake --build "$root/build-gpu" -j"${JOBS:-2}" --target hpctrain hpctrain_cuda "${tests[@]}"
module=$root/build-gpu/lib/libhpctrain_cuda.so
[[ -f $module ]] || { echo "pack-gpu.sh: $module was not built (is nvcc found?)" >&2; exit 2; }
mkdir -p "$(dirname "$out")"
# h5diff: gpu-check.sh compares metrics and checkpoints bit for bit with it (the GPU machine has no HDF5 tools).
extra_programs=()
h5diff=$(command -v h5diff || true)
[[ -n $h5diff ]] && extra_programs+=("$h5diff")
"$pack" "$out" "$root/build-gpu/bin/hpctrain" "$module" "${tests[@]/#/$root/build-gpu/tests/}" "${extra_programs[@]}"
echo "packed $(du -h "$out" | cut -f1) into $out"
