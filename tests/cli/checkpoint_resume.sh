#!/usr/bin/env bash
# Checkpoints and exact resume: a run interrupted at step 20 and resumed gives bit-identical parameters and optimizer
# state at step 40 to the uninterrupted run (1 and 2 ranks; fp32, bf16, fp16 with loss scaling and dropout; 4 ranks on
# two simulated nodes); a 2 -> 4 rank resume continues the same global data order; damaged or truncated checkpoints
# are detected and resume falls back to the previous one; a checkpoint of another model is refused naming the tensor.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 3000 1
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 64
[model]
layers = [ { type = "linear", out = 24 }, { type = "layernorm" }, { type = "gelu" }, { type = "dropout", p = 0.2 },
           { type = "linear", out = 3 } ]
[optimizer]
lr = 0.01
weight_decay = 0.01
[train]
steps = 40
log_every = 20
TOML
for mode in fp32 bf16 fp16; do
  for ranks in 1 2; do
    name=$mode-np$ranks
    run_ranks $ranks train deck.toml --output full-$name --set precision.mode=$mode >/dev/null 2>&1 || fail "$name: full run"
    run_ranks $ranks train deck.toml --output part-$name --set precision.mode=$mode --set train.steps=20 >/dev/null 2>&1 ||
      fail "$name: first half"
    run_ranks $ranks train deck.toml --output part-$name --set precision.mode=$mode --resume auto >part-$name.log 2>&1 ||
      { cat part-$name.log >&2; fail "$name: resume"; }
    grep -q "resumed from .*step-00000020.h5 at step 20" part-$name.log || fail "$name: did not resume from step 20"
    $PYTHON "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/same_datasets.py" full-$name/checkpoints/step-00000040.h5 \
      part-$name/checkpoints/step-00000040.h5 &&
      pass "$name: exact resume" || fail "$name: resumed state differs"
  done
done

# 2 -> 4 ranks: the slices are re-cut; the global batches stay the same, so the losses follow the uninterrupted run
# (to rounding: sums over 4 ranks associate differently).
run_ranks 4 train deck.toml --resume part-fp32-np2/checkpoints/step-00000020.h5 \
  --output resharded >resharded.log 2>&1 || { cat resharded.log >&2; fail "2 -> 4 rank resume"; }
$PYTHON - <<'PY' && pass "2 -> 4 rank resume follows the uninterrupted run" || fail "2 -> 4 rank resume diverged"
import h5py, numpy as np
full = h5py.File("full-fp32-np2/metrics.h5", "r")["/train/loss"][20:]
resumed_file = h5py.File("resharded/metrics.h5", "r")
steps, resumed = resumed_file["/train/step"][:], resumed_file["/train/loss"][:]
assert steps[0] == 21 and len(resumed) == 20, steps
rel = np.abs(resumed - full) / np.abs(full)
print(f"largest relative loss difference {rel.max():.2e}")
assert rel.max() < 1e-4
PY

# Ranks on several nodes (HPCTRAIN_NODE_ID): with as many ranks on every node, each rank reads its node's slice of the
# state and the nodes exchange theirs ("a b b a": node a holds ranks 0 and 3, so the nodes' order is not the ranks');
# with unequal nodes ("a a a b") each rank reads its own slice and all ranks gather them. Both resume exactly.
for nodes in "a b b a" "a a a b"; do
  name=nodes-${nodes// /}
  run_on_nodes "$nodes" train deck.toml --output full-$name >/dev/null 2>&1 || fail "$name: full run"
  run_on_nodes "$nodes" train deck.toml --output part-$name --set train.steps=20 >/dev/null 2>&1 ||
    fail "$name: first half"
  run_on_nodes "$nodes" train deck.toml --output part-$name --resume auto >part-$name.log 2>&1 ||
    { cat part-$name.log >&2; fail "$name: resume"; }
  $PYTHON "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/same_datasets.py" full-$name/checkpoints/step-00000040.h5 \
    part-$name/checkpoints/step-00000040.h5 && pass "$name: exact resume" || fail "$name: resumed state differs"
done

# Damage: flip bytes inside the newest checkpoint's data; resume falls back to the previous checkpoint.
cp -r part-fp32-np2 damaged
run_ranks 2 train deck.toml --output damaged --set train.steps=60 --resume auto >/dev/null 2>&1 || fail "damaged: setup"
newest=damaged/checkpoints/step-00000060.h5
offset=$($PYTHON -c "import h5py; print(h5py.File('$newest', 'r')['/model/linear0/weight'].id.get_offset())")
printf '\xde\xad\xbe\xef\xde\xad\xbe\xef' | dd of="$newest" bs=1 seek=$((offset + 8)) conv=notrunc status=none
"$HPCTRAIN" checkpoint verify "$newest" >verify.log 2>&1 && fail "verify passed a damaged file" || pass "verify: $(cat verify.log)"
run_ranks 2 train deck.toml --output damaged --set train.steps=60 --resume auto >damaged.log 2>&1 ||
  { cat damaged.log >&2; fail "damaged: resume"; }
grep -q "warning: .*step-00000060.h5" damaged.log && grep -q "resumed from .*step-00000040.h5" damaged.log &&
  pass "damaged checkpoint detected, resumed from the previous one" || { cat damaged.log >&2; fail "no fallback"; }
# Those lines come before train.log is opened (the start is decided first); they reach it all the same.
grep -q "warning: .*step-00000060.h5" damaged/train.log && grep -q "resumed from .*step-00000040.h5" damaged/train.log &&
  pass "train.log has the fallback's warning and the resume" || { cat damaged/train.log >&2; fail "train.log lacks them"; }
# Truncation: the same.
truncate -s $(( $(stat -c %s "$newest") / 3 )) "$newest"
run_ranks 2 train deck.toml --output damaged --set train.steps=60 --resume auto >truncated.log 2>&1 ||
  { cat truncated.log >&2; fail "truncated: resume"; }
grep -q "resumed from .*step-00000040.h5" truncated.log && pass "truncated checkpoint: fell back" || fail "truncated: no fallback"

# A tensor larger than one write piece (8 Mi floats: a single process writes in pieces and starts each one's
# write-out): 16 x 540,000 weights. The checkpoint verifies, and a resume from it continues exactly.
"$HPCTRAIN" data generate blobs --samples 64 --features 16 --classes 2 --output wide.h5 >/dev/null
cat >wide.toml <<'TOML'
[data]
train = "wide.h5"
batch_size = 2
[model]
layers = [ { type = "linear", out = 540000 }, { type = "relu" }, { type = "linear", out = 2 } ]
[train]
steps = 2
log_every = 1
TOML
run_ranks 1 train wide.toml --output wide-full >wide-full.log 2>&1 || { cat wide-full.log >&2; fail "wide: full run"; }
run_ranks 1 train wide.toml --output wide-part --set train.steps=1 >wide-part.log 2>&1 || fail "wide: first step"
"$HPCTRAIN" checkpoint verify wide-part >wide-verify.log 2>&1 && pass "wide: checkpoint written in pieces verifies" ||
  { cat wide-verify.log >&2; fail "wide: verify"; }
# The resume reads the file directly, its pieces spread over 2 threads (each checksummed, the CRCs combined in order).
OMP_NUM_THREADS=2 run_ranks 1 train wide.toml --output wide-part --resume auto >wide-resume.log 2>&1 ||
  { cat wide-resume.log >&2; fail "wide: resume"; }
$PYTHON "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/same_datasets.py" wide-full/checkpoints/step-00000002.h5 \
  wide-part/checkpoints/step-00000002.h5 && pass "wide: exact resume" || fail "wide: resumed state differs"
# One byte changed far into the weight (in the second thread's pieces): that read fails the checksum.
cp wide-part/checkpoints/step-00000001.h5 wide-flipped.h5
$PYTHON - wide-flipped.h5 <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    at = f["model/linear0/weight"].id.get_offset() + 7_000_000 * 4 + 1
with open(sys.argv[1], "r+b") as f:
    f.seek(at)
    byte = f.read(1)[0]
    f.seek(at)
    f.write(bytes([byte ^ 0x10]))
PY
OMP_NUM_THREADS=2 run_ranks 1 train wide.toml --output wide-flipped --resume wide-flipped.h5 >wide-flipped.log 2>&1 &&
  fail "wide: a changed byte was not detected"
grep -q "model/linear0/weight fails its checksum" wide-flipped.log && pass "wide: a changed byte fails the checksum" ||
  { cat wide-flipped.log >&2; fail "wide: no checksum error"; }
rm -rf wide-full wide-part wide-flipped wide-flipped.h5

# Two ranks (MPI-IO) write in pieces too, from a descriptor of their own that starts the write-out, and read their
# slices directly: a 16 x 1,100,000 weight gives each rank 8.8 Mi floats, two pieces.
sed 's/out = 540000/out = 1100000/' wide.toml >wider.toml
run_ranks 2 train wider.toml --output wider-full >wider-full.log 2>&1 || { cat wider-full.log >&2; fail "wider: full run"; }
run_ranks 2 train wider.toml --output wider-part --set train.steps=1 >wider-part.log 2>&1 || fail "wider: first step"
"$HPCTRAIN" checkpoint verify wider-part >wider-verify.log 2>&1 &&
  pass "wider: a checkpoint two ranks wrote in pieces verifies" || { cat wider-verify.log >&2; fail "wider: verify"; }
run_ranks 2 train wider.toml --output wider-part --resume auto >wider-resume.log 2>&1 ||
  { cat wider-resume.log >&2; fail "wider: resume"; }
$PYTHON "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/same_datasets.py" wider-full/checkpoints/step-00000002.h5 \
  wider-part/checkpoints/step-00000002.h5 && pass "wider: exact resume on 2 ranks" || fail "wider: resumed state differs"
rm -rf wider-full wider-part

# Another model: refused, naming the first tensor that does not fit.
expect_error model_mismatch "linear0/weight has shape \(24, 2\) but the deck's model needs \(32, 2\)" 2 \
  train deck.toml --output mismatch --resume part-fp32-np2/checkpoints/step-00000040.h5 \
  --set 'model.layers[0].out=32'
finish
