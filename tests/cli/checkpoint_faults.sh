#!/usr/bin/env bash
# Faults during checkpointing: kill -9 of all ranks at random moments while they write a checkpoint every step,
# repeated; after each kill the checkpoint `latest` names passes its checksums and loads. And a write that fails
# (file-size limit standing in for a full disk) gives one clear error (also in train.log), removes the partial file
# and leaves the previous checkpoint intact.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2000 1
wide_mlp_deck deck.toml 1000000 1
trials=${HPCTRAIN_KILL_TRIALS:-20}
checkpointed_or_ended() { [[ -f run/checkpoints/latest ]] || ! kill -0 "$launcher" 2>/dev/null; }
sound=0
for trial in $(seq "$trials"); do
  # shellcheck disable=SC2086
  $MPIEXEC -n 2 "$HPCTRAIN" train deck.toml --output "$WORK/run" --resume auto >trial.log 2>&1 &
  launcher=$!
  wait_until 180 checkpointed_or_ended || { fail "trial $trial: no checkpoint within 180 s"; break; }
  if ! kill -0 $launcher 2>/dev/null; then cat trial.log >&2; fail "trial $trial: the run ended by itself"; break; fi
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  pkill -9 -f "train deck.toml --output $WORK/run" || true  # this test's ranks only (tests run in parallel)
  wait $launcher 2>/dev/null || true
  if "$HPCTRAIN" checkpoint verify run >verify.log 2>&1; then
    sound=$((sound + 1))
  else
    fail "trial $trial: latest checkpoint damaged: $(cat verify.log)"
  fi
done
((sound == trials)) && pass "$trials kill -9 trials: latest always sound ($(ls run/checkpoints | tr '\n' ' '))"
# ... and it loads: resume for a few more steps.
latest=$(sed -n 's/.*step-0*\([0-9]*\)\.h5/\1/p' run/checkpoints/latest)
run_ranks 2 train deck.toml --output run --resume auto --set train.steps=$((latest + 2)) >resume.log 2>&1 &&
  pass "resumed after the kills from step $latest" || { cat resume.log >&2; fail "resume after kills"; }

# A failing write: a 400 KiB file-size limit (above metrics.h5, below a checkpoint of this model) makes the new checkpoint's write fail; the previous one stays committed.
before=$(cat run/checkpoints/latest)
status=0
# The limit applies to the ranks only (mpiexec's own files must stay writable).
# shellcheck disable=SC2086
timeout 120 $MPIEXEC -n 2 bash -c "ulimit -f 400; trap '' XFSZ; exec \"\$0\" \"\$@\"" "$HPCTRAIN" train deck.toml \
  --output run --resume auto --set train.steps=$((latest + 4)) >full.log 2>&1 || status=$?
((status != 0)) && grep -q "hpctrain: error:" full.log && pass "failed write reported: $(grep -m1 "hpctrain: error" full.log)" ||
  { cat full.log >&2; fail "a failing checkpoint write was not reported"; }
[[ $(cat run/checkpoints/latest) == "$before" ]] && "$HPCTRAIN" checkpoint verify run >/dev/null &&
  pass "previous checkpoint intact ($before)" || fail "previous checkpoint damaged"
# ... said once, in words (not HDF5's calls), also in train.log, and the partial file is gone.
check_write_failure "failed checkpoint write" full.log run "writing checkpoint '.*' failed: the file would pass the file-size limit"
partials=$(find run/checkpoints -name '*.partial')
[[ -z $partials ]] && pass "no partial checkpoint left" || fail "partial checkpoint left: $partials"
finish
