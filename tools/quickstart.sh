#!/usr/bin/env bash
# README command (1): install what is missing, build (Release), create the default dataset with hpctrain itself if it is
# not there, and train inputs/default.toml on 2 MPI ranks. Extra arguments go to `hpctrain train`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j2
hpctrain=build/release/bin/hpctrain
# Open MPI refuses more ranks than cores and root without these flags; MPICH-family launchers allow both and reject
# them.
mpiexec_flags=()
if mpiexec --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then
  mpiexec_flags=(--oversubscribe --bind-to none)
  [[ $(id -u) -eq 0 ]] && mpiexec_flags+=(--allow-run-as-root)
fi
mkdir -p data
[[ -f data/spirals-train.h5 ]] ||
  "$hpctrain" data generate spirals --samples 20000 --classes 3 --noise 0.05 --seed 1 --output data/spirals-train.h5
[[ -f data/spirals-validation.h5 ]] ||
  "$hpctrain" data generate spirals --samples 4000 --classes 3 --noise 0.05 --seed 2 --output data/spirals-validation.h5
output=runs/default-$(date +%Y%m%d-%H%M%S)
mpiexec -n 2 "${mpiexec_flags[@]}" "$hpctrain" train inputs/default.toml --output "$output" "$@"
