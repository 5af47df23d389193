#!/usr/bin/env bash
# hpctrain never overwrites a run: a directory that holds anything hpctrain writes is a run, and only that run may
# continue there (--resume auto, or --resume with one of its own checkpoints); another run's checkpoint needs --force.
# A finished run resumed says so and changes nothing. Damaged checkpoints are named once, without HDF5 call text.
# Errors decided by every rank end without Open MPI's abort banner and reach train.log once the run has opened it.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2000 1
make_spirals validation.h5 300 2
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 64
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 20
log_every = 10
[checkpoint]
every_steps = 10
TOML
fingerprint() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 md5sum); }
rows() { $PYTHON -c "import h5py, sys; print(len(h5py.File(sys.argv[1], 'r')['/train/step']))" "$1"; }

# 1. Checkpoints but no metrics.h5 still make a run: a fresh start there is refused and nothing changes.
run_ranks 2 train deck.toml --output A >A.log 2>&1 || { cat A.log >&2; fail "run A"; }
rm A/metrics.h5
before=$(fingerprint A)
expect_error fresh_over_checkpoints "already holds a run \(config.toml, train.log, status, checkpoints/ \(2 files\)\)" 2 \
  train deck.toml --output A --set train.steps=30
[[ $(fingerprint A) == "$before" ]] && pass "run A untouched" || fail "run A was changed by a refused start"

# 2. Another run's checkpoint into a finished run: refused without --force; B keeps its metrics, config, checkpoints.
run_ranks 2 train deck.toml --output B --set train.steps=30 >B.log 2>&1 || { cat B.log >&2; fail "run B"; }
before=$(fingerprint B)
expect_error resume_into_other_run "holds another run .*continuing there would replace its results" 2 \
  train deck.toml --output B --set train.steps=30 --resume A/checkpoints/step-00000010.h5
[[ $(fingerprint B) == "$before" ]] && pass "run B untouched" || fail "run B was changed by a refused resume"
# ... its own checkpoints are fine (a rollback), named as a file, the run directory or checkpoints/latest.
run_ranks 2 train deck.toml --output B --set train.steps=40 --resume B/checkpoints/latest >rollforward.log 2>&1 &&
  grep -q "resumed from B/checkpoints/step-00000030.h5 at step 30" rollforward.log &&
  pass "resume B from B/checkpoints/latest" || { cat rollforward.log >&2; fail "resume from a run's own latest"; }
# ... and with --force A's checkpoint continues in B; B's newer checkpoints go (a fallback must not pick them).
run_ranks 2 train deck.toml --output B --set train.steps=30 --resume A --force >forced.log 2>&1 ||
  { cat forced.log >&2; fail "--force"; }
grep -q "removed 2 checkpoints past step 20" forced.log && [[ ! -e B/checkpoints/step-00000040.h5 ]] &&
  (($(rows B/metrics.h5) == 30)) && pass "--force: continued A's step 20 in B, newer checkpoints removed" ||
  { cat forced.log >&2; ls B/checkpoints >&2; fail "--force did not continue as documented"; }

# 3. --resume auto on a finished run without checkpoints: refused, its metrics kept.
run_ranks 2 train deck.toml --output C --set train.steps=5 --set checkpoint.every_steps=0 --set checkpoint.at_end=false \
  >C.log 2>&1 || { cat C.log >&2; fail "run C"; }
expect_error auto_without_checkpoint "holds a run \(metrics.h5, config.toml, train.log, status\) but no checkpoint" 2 \
  train deck.toml --output C --resume auto
(($(rows C/metrics.h5) == 5)) && pass "run C keeps its 5 rows" || fail "run C lost rows"
# ... while an absent directory starts fresh.
run_ranks 2 train deck.toml --output D --resume auto >D.log 2>&1 && grep -q "no run in 'D'; starting fresh" D.log &&
  pass "--resume auto into a new directory starts fresh" || { cat D.log >&2; fail "--resume auto fresh start"; }

# 11. A finished run resumed: says so, exit 0, nothing written, no made-up figures.
before=$(fingerprint D)
run_ranks 2 train deck.toml --output D --resume auto >complete.log 2>&1 || { cat complete.log >&2; fail "complete: exit"; }
grep -q "already complete at step 20" complete.log && ! grep -qE "final train loss|accuracy -1|samples/s" complete.log &&
  pass "finished run: $(grep -o 'already complete at step [0-9]*' complete.log)" || { cat complete.log >&2; fail "complete"; }
[[ $(fingerprint D) == "$before" ]] && pass "finished run untouched" || fail "a finished run was rewritten"
# ... and a run stopped before its first evaluation prints no validation figure.
status=0
run_ranks 2 train deck.toml --output E --set train.steps=100000000 --set train.time_limit=00:00:02 >E.log 2>&1 ||
  status=$?
((status == 75)) && grep -q "^stopped: " E.log && ! grep -q "accuracy -1" E.log &&
  pass "stopped run: $(grep '^stopped: ' E.log)" || { cat E.log >&2; fail "stopped run summary (exit $status)"; }

# 14/15. Damaged metadata: named as damaged, without HDF5 call text; each problem printed once.
$PYTHON - <<'PY'
import h5py
path = "D/checkpoints/step-00000020.h5"
with h5py.File(path, "r") as f:
    address = h5py.h5o.get_info(f["/model"].id).addr  # the /model group's object header
with open(path, "r+b") as f:
    f.seek(address + 16)
    f.write(b"\xa5" * 64)
PY
rm D/checkpoints/step-00000010.h5
expect_error damaged_metadata "step-00000020.h5' is damaged" 2 train deck.toml --output D --resume auto \
  --set train.steps=30
log="$WORK/damaged_metadata.log"
! grep -qE "H5[A-Z][a-z]*|\.cpp:[0-9]+" "$log" && pass "no HDF5 call or source text" || { cat "$log"; fail "raw HDF5 text"; }
(($(grep -c "step-00000020.h5" "$log") == 1)) && pass "the damaged checkpoint is named once" ||
  { cat "$log"; fail "the problem is printed more than once"; }

# 18/19. An error after start-up reaches train.log; errors every rank sees end without Open MPI's MPI_Abort banner.
expect_error diverged "NaN/Inf" 2 train deck.toml --output F --set optimizer.lr=1e30 --set optimizer.type=\"sgd\"
grep -q "hpctrain: error: .*NaN/Inf" F/train.log && pass "the error is in train.log" || fail "error missing from train.log"
for name in fresh_over_checkpoints auto_without_checkpoint diverged; do
  ! grep -qE "MPI_ABORT was invoked|ORTE_ERROR_LOG" "$WORK/$name.log" && pass "$name: no MPI_ABORT banner" ||
    { cat "$WORK/$name.log"; fail "$name: MPI_ABORT banner"; }
done
finish
