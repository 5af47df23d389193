#!/usr/bin/env bash
# Writes that fail for lack of room. metrics.h5 stopped from growing by a file-size limit (checkpoints off): one error
# that names the file and the limit, in train.log too; OUTPUT/config.toml that cannot be replaced stays whole. Then a real full file system (a small tmpfs in a private mount
# namespace, where unshare and mount are allowed; skipped elsewhere): a checkpoint that does not fit is reported once
# with the free space and what it needs, its partial file removed and the previous checkpoint kept; and metrics.h5
# on a file system filled up.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2000 1
wide_mlp_deck deck.toml 8 2
no_checkpoints=(--set checkpoint.every_steps=0 --set checkpoint.at_end=false)

# metrics.h5 under a 40 KiB file-size limit: created, then its first row (a chunk per column) does not fit. The limit
# applies to the ranks only (mpiexec's own files must stay writable).
status=0
# shellcheck disable=SC2086
timeout 120 $MPIEXEC -n 2 bash -c "ulimit -f 40; trap '' XFSZ; exec \"\$0\" \"\$@\"" "$HPCTRAIN" train deck.toml \
  --output limited "${no_checkpoints[@]}" >limited.log 2>&1 || status=$?
((status != 0 && status != 124)) && pass "metrics write under ulimit -f stops the run (exit $status)" ||
  { cat limited.log >&2; fail "metrics write under ulimit -f: exit $status"; }
check_write_failure "metrics.h5 at the file-size limit" limited.log limited \
  "writing the metrics file 'limited/metrics.h5' failed: the file would pass the file-size limit \(ulimit -f\) of 40.0 KiB"
[[ $(cat limited/status) == "failed 1 step 0" ]] && pass "status: $(cat limited/status)" ||
  fail "status after the metrics failure: $(cat limited/status)"

# OUTPUT/config.toml (a resume compares its deck with it) under a 1 KiB limit, smaller than the deck: the resume stops
# naming it, and the file written by the first run is still whole.
run_ranks 2 train deck.toml --output deck-kept --set train.steps=5 >kept.log 2>&1 ||
  { cat kept.log >&2; fail "deck-kept: first run"; }
cp deck-kept/config.toml deck-before.toml
status=0
# shellcheck disable=SC2086
timeout 120 $MPIEXEC -n 2 bash -c "ulimit -f 1; trap '' XFSZ; exec \"\$0\" \"\$@\"" "$HPCTRAIN" train deck.toml \
  --output deck-kept --resume auto --set train.steps=10 >deck-limited.log 2>&1 || status=$?
grep -q "hpctrain: error: writing 'deck-kept/config.toml.partial' failed: the file would pass the file-size limit" \
  deck-limited.log && ((status != 0 && status != 124)) && cmp -s deck-kept/config.toml deck-before.toml &&
  pass "config.toml under ulimit -f: the run stops (exit $status), the previous config.toml is whole" ||
  { cat deck-limited.log >&2; fail "config.toml under ulimit -f: exit $status or the file changed"; }

# A real full file system: a tmpfs mounted in a private mount namespace (as root, or as a user where unprivileged user
# namespaces are allowed).
namespace=(unshare -m)
((EUID == 0)) || namespace=(unshare -rm)
mkdir small
if ! "${namespace[@]}" sh -c "mount -t tmpfs -o size=64k tmpfs small && umount small" 2>/dev/null; then
  pass "skipped the full file system checks: cannot mount a tmpfs here ($("${namespace[@]}" true 2>&1 | head -1))"
  finish
  exit
fi
# in_small_fs SIZE_KIB FILL_KIB LOG COMMAND...: COMMAND (hpctrain's arguments) on 2 ranks with small/ a tmpfs of
# SIZE_KIB that FILL_KIB of filler already occupy; afterwards small/ is copied to small-copy/ for the checks.
in_small_fs() {
  local size=$1 fill=$2 log=$3
  shift 3
  # shellcheck disable=SC2016
  "${namespace[@]}" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash -c '
    size=$1 fill=$2 log=$3; shift 3
    mount -t tmpfs -o size=${size}k tmpfs small || exit 3
    ((fill == 0)) || head -c $((fill * 1024)) /dev/zero >small/filler
    status=0
    timeout 120 $MPIEXEC -n 2 "$HPCTRAIN" "$@" >"$log" 2>&1 || status=$?
    rm -rf small-copy && cp -a small small-copy
    exit $status' in_small_fs "$size" "$fill" "$log" "$@"
}
# Room for the first checkpoint (840 KB) and metrics.h5, not for the second.
status=0
in_small_fs 1100 0 full.log train deck.toml --output small/run || status=$?
((status != 0 && status != 124)) && pass "a checkpoint on a full file system stops the run (exit $status)" ||
  { cat full.log >&2; fail "checkpoint on a full file system: exit $status"; }
check_write_failure "checkpoint on a full file system" full.log small-copy/run \
  "writing checkpoint 'small/run/checkpoints/step-00000004.h5' failed: the file system is full \([0-9.]+ [KM]iB free in small/run/checkpoints; the checkpoint needs about [0-9.]+ KiB\); the previous checkpoint is intact"
[[ $(ls small-copy/run/checkpoints) == $'latest\nstep-00000002.h5' && $(cat small-copy/run/checkpoints/latest) == step-00000002.h5 ]] &&
  "$HPCTRAIN" checkpoint verify small-copy/run >/dev/null &&
  pass "partial checkpoint removed, the previous one committed and sound" ||
  fail "after the full disk: $(ls small-copy/run/checkpoints | tr '\n' ' ')"

# metrics.h5 on a file system with 40 KiB left: created, then no room for its first row.
status=0
in_small_fs 256 216 metrics-full.log train deck.toml --output small/run "${no_checkpoints[@]}" || status=$?
((status != 0 && status != 124)) && pass "metrics.h5 on a full file system stops the run (exit $status)" ||
  { cat metrics-full.log >&2; fail "metrics.h5 on a full file system: exit $status"; }
check_write_failure "metrics.h5 on a full file system" metrics-full.log small-copy/run \
  "writing the metrics file 'small/run/metrics.h5' failed: the file system is full"
finish
