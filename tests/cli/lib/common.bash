# Shared helpers for the command-line tests (sourced, not run). The CMake test driver sets HPCTRAIN (the binary),
# HPCTRAIN_SOURCE_DIR, MPIEXEC (mpiexec and the launcher flags for this MPI: with Open MPI --oversubscribe and, as
# root, --allow-run-as-root; cmake/HpctrainTest.cmake), MPIEXEC_FLAGS (those flags alone) and PYTHON (the python3 that
# imports h5py and numpy, found at configure time). The defaults are for running a script by hand on Debian.
set -euo pipefail
: "${HPCTRAIN:?set by CTest}" "${HPCTRAIN_SOURCE_DIR:?set by CTest}" "${MPIEXEC:=mpiexec --oversubscribe}"
: "${MPIEXEC_FLAGS:=--oversubscribe}" "${PYTHON:=/usr/bin/python3}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-cli.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# run_ranks N ARGS...: hpctrain on N ranks, with a time limit so a hang fails the test instead of stalling CI.
run_ranks() {
  local ranks=$1; shift
  # shellcheck disable=SC2086
  timeout 120 $MPIEXEC -n "$ranks" "$HPCTRAIN" "$@"
}

# run_on_nodes "a b b a" ARGS...: hpctrain on as many ranks as names, rank r counting as a rank of node name r
# (HPCTRAIN_NODE_ID), so that one machine runs the code paths of several nodes.
run_on_nodes() {
  local names=$1; shift
  # shellcheck disable=SC2016,SC2086
  timeout 120 $MPIEXEC -n "$(wc -w <<<"$names")" sh -c 'rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
    HPCTRAIN_NODE_ID=$(echo "$1" | cut -d " " -f $((rank + 1))) && export HPCTRAIN_NODE_ID && shift && exec "$@"' \
    node-of-rank "$names" "$HPCTRAIN" "$@"
}

# wait_until SECONDS COMMAND...: poll COMMAND until it succeeds (true) or SECONDS have passed (false). Limits are
# generous: they cost nothing when the machine is fast, and a busy machine must not fail a test.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# make_spirals FILE SAMPLES [SEED]
make_spirals() {
  "$HPCTRAIN" data generate spirals --samples "$2" --classes 3 --noise 0.05 --seed "${3:-1}" --output "$1" >/dev/null
}

# make_gpl3_tokens: data/gpl3-train.h5 and data/gpl3-validation.h5 as inputs/gpt-tiny.toml's header makes them (GPL-3,
# byte-level, windows of 64, a tenth for validation), $licence its path; exits 77 (skipped) where it is missing.
make_gpl3_tokens() {
  licence=/usr/share/common-licenses/GPL-3  # global: tests read it afterwards
  [[ -r $licence ]] || { echo "skipped: $licence is missing"; exit 77; }
  mkdir -p data
  "$HPCTRAIN" data convert --text "$licence" --validation-fraction 0.1 --sequence-length 64 \
    --output data/gpl3-train.h5 --validation-output data/gpl3-validation.h5 >convert.log 2>&1 ||
    { cat convert.log >&2; fail "convert --text"; }
}

# tiny_mlp_deck FILE: a 2-step deck on train.h5 (spirals) with a 2-8-3 MLP, for tests of what surrounds training.
tiny_mlp_deck() {
  cat >"$1" <<'TOML'
[data]
train = "train.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 8 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 2
TOML
}

# wide_mlp_deck FILE STEPS EVERY_STEPS: a deck on train.h5 (spirals) whose 2-256-256-3 MLP with AdamW makes checkpoints
# of about 840 KB, written every EVERY_STEPS steps, the newest 2 kept.
wide_mlp_deck() {
  cat >"$1" <<TOML
[data]
train = "train.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 256 }, { type = "relu" }, { type = "linear", out = 256 }, { type = "relu" },
           { type = "linear", out = 3 } ]
[train]
steps = $2
log_every = 1000
[checkpoint]
every_steps = $3
keep = 2
TOML
}

# expect_error NAME PATTERN RANKS ARGS...: the run must fail (non-zero, not a timeout), print PATTERN, and print
# exactly one "hpctrain: error:" line however many ranks ran.
expect_error() {
  local name=$1 pattern=$2 ranks=$3; shift 3
  local log="$WORK/$name.log" status=0
  run_ranks "$ranks" "$@" >"$log" 2>&1 || status=$?
  if ((status == 0)); then fail "$name: exit status 0"; cat "$log" >&2; return; fi
  if ((status == 124)); then fail "$name: hung (timeout)"; cat "$log" >&2; return; fi
  if ! grep -qE -- "$pattern" "$log"; then fail "$name: message does not match '$pattern'"; cat "$log" >&2; return; fi
  local copies
  copies=$(grep -c "hpctrain: error:" "$log" || true)
  if ((copies != 1)); then fail "$name: $copies error messages instead of 1"; cat "$log" >&2; return; fi
  pass "$name (exit $status): $(grep "hpctrain: error:" "$log")"
}

# check_write_failure NAME LOG RUN_DIR PATTERN: a failed write of a run was reported once (one "hpctrain: error:" line
# matching PATTERN), in words rather than HDF5's calls or our source locations, without HDF5's close warnings, and
# the same line reached RUN_DIR/train.log.
check_write_failure() {
  local name=$1 log=$2 run=$3 pattern=$4 copies
  copies=$(grep -c "hpctrain: error:" "$log" || true)
  if ((copies != 1)); then fail "$name: $copies error messages instead of 1"; cat "$log" >&2; return; fi
  grep -qE -- "$pattern" "$log" || { fail "$name: message does not match '$pattern'"; cat "$log" >&2; return; }
  if grep -qE 'H5[A-Z][a-z_]+\(|\.cpp:[0-9]|closing an HDF5 object failed' "$log"; then
    fail "$name: HDF5 call text, source locations or close warnings printed"; cat "$log" >&2; return
  fi
  grep -q "hpctrain: error: .*$(grep -o "failed: [a-z -]*" "$log" | head -1)" "$run/train.log" ||
    { fail "$name: the error is not in $run/train.log"; return; }
  pass "$name: $(grep "hpctrain: error:" "$log")"
}

finish() {
  if ((failures > 0)); then echo "$failures check(s) failed" >&2; exit 1; fi
  echo "all checks passed"
}
