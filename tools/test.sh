#!/usr/bin/env bash
# README command (2): install what is missing, build (Release, with tests) and run the whole CTest suite.
# Extra arguments go to ctest (e.g. -L unit, -R config).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j2
ctest --test-dir build/release --output-on-failure -j2 "$@"
