#!/usr/bin/env bash
# run.device and the deferred read-back of step results (what the CUDA backend does to avoid a host synchronisation per
# step), checked on machines without a GPU:
# - "cuda" without a GPU (or in a CPU-only build) stops every rank with one message; "auto" falls back to the CPU;
# - HPCTRAIN_DEFERRED_READBACK=1 defers on the CPU backend: on 2 ranks, with loss-scaler skips, evaluation and
#   checkpoints in between, every metrics row and the checkpoints equal those of the per-step read-back;
# - linear + relu and linear + gelu(tanh) paired as the CUDA backend folds them (the activation in the product, its
#   backward in the next linear layer's input-gradient product) gives the same training bit for bit;
# - a rank with more threads than cores gets a start-up warning.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2048 1
make_spirals validation.h5 512 2
cat >deck.toml <<'TOML'
[run]
seed = 3
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 64
[model]
layers = [
  { type = "linear", out = 32 }, { type = "layernorm" }, { type = "gelu" }, { type = "dropout", p = 0.1 },
  { type = "linear", out = 3 },
]
[optimizer]
type = "adamw"
lr = 0.01
[precision]
mode = "fp16"
init_scale = 1e8
growth_interval = 5
[train]
steps = 45
log_every = 10
eval_every = 15
[checkpoint]
every_steps = 7
TOML

if run_ranks 2 train deck.toml --set run.device=cuda --output gpu >gpu.log 2>&1; then
  pass "run.device = cuda ran (this machine has a GPU)"
else
  expect_error no-gpu "no rank sees a CUDA device|this build has no CUDA backend" 2 train deck.toml \
    --set run.device=cuda --output no-gpu
  run_ranks 2 train deck.toml --set run.device=auto --set train.steps=3 --output auto >auto.log 2>&1 ||
    { cat auto.log >&2; fail "run.device = auto"; }
  grep -q "backend cpu" auto.log && pass "auto falls back to the CPU" || fail "auto did not use the CPU backend"
fi

run_ranks 2 train deck.toml --output eager >eager.log 2>&1 || { cat eager.log >&2; fail "eager run"; }
HPCTRAIN_DEFERRED_READBACK=1 run_ranks 2 train deck.toml --output deferred >deferred.log 2>&1 ||
  { cat deferred.log >&2; fail "deferred run"; }
$PYTHON - <<'PY' || fail "deferred read-back changed the results"
import h5py, numpy as np
eager, deferred = h5py.File("eager/metrics.h5", "r"), h5py.File("deferred/metrics.h5", "r")
for group in ("train", "eval"):
    for name in eager[group]:
        if name == "samples_per_sec":
            continue
        a, b = eager[group][name][:], deferred[group][name][:]
        assert np.array_equal(a, b, equal_nan=True), (group, name, a, b)
skipped = int(eager["train/skipped"][:].sum())
assert len(eager["train/loss"]) == 45 and 0 < skipped < 45, skipped
print(f"45 steps, {skipped} skipped by the loss scaler: every metrics row identical")
import glob, os
kept = sorted(os.path.basename(path) for path in glob.glob("eager/checkpoints/step-*.h5"))
assert kept and kept == sorted(os.path.basename(path) for path in glob.glob("deferred/checkpoints/step-*.h5")), kept
for name in kept:
    a, b = h5py.File(f"eager/checkpoints/{name}", "r"), h5py.File(f"deferred/checkpoints/{name}", "r")
    def compare(name, item):
        if isinstance(item, h5py.Dataset):
            assert np.array_equal(item[()], b[name][()]), name
    a.visititems(compare)
print(f"checkpoints {kept} identical")
PY

# Linear + relu and linear + gelu(tanh) folded into one product (issue 15, item 9; the CUDA backend's RELU_AUX_BIAS and
# GELU_AUX_BIAS epilogues), their backward into the next linear layer's input-gradient product (DRELU, DGELU): the
# model runs them through Backend::linear_activation_forward/backward. HPCTRAIN_FOLD_LINEAR_RELU=1 pairs the layers on
# the CPU backend too (its defaults compose the operations): every metrics row and the final checkpoint must equal
# the unpaired run's.
relu_layers='model.layers=[{type="linear", out=32}, {type="relu"}, {type="linear", out=32}, {type="gelu", approximate="tanh"}, {type="linear", out=3}]'
run_ranks 2 train deck.toml --set "$relu_layers" --set train.steps=30 --output relu-plain >relu-plain.log 2>&1 ||
  { cat relu-plain.log >&2; fail "relu run"; }
HPCTRAIN_FOLD_LINEAR_RELU=1 run_ranks 2 train deck.toml --set "$relu_layers" --set train.steps=30 --output relu-folded \
  >relu-folded.log 2>&1 || { cat relu-folded.log >&2; fail "relu run, folded"; }
grep -q "2 linear + activation pair(s) run as one product" relu-folded.log || fail "the hook did not pair the layers"
$PYTHON - <<'PY' && pass "linear + relu, linear + gelu(tanh) paired (backward in the next product): metrics and checkpoint identical" ||
import h5py, numpy as np
a, b = h5py.File("relu-plain/metrics.h5", "r"), h5py.File("relu-folded/metrics.h5", "r")
for group in ("train", "eval"):
    for name in a[group]:
        if name != "samples_per_sec":
            assert np.array_equal(a[group][name][:], b[group][name][:], equal_nan=True), (group, name)
assert len(a["train/loss"]) == 30 and np.all(np.isfinite(a["train/loss"][:]))
x, y = h5py.File("relu-plain/checkpoints/step-00000030.h5", "r"), h5py.File("relu-folded/checkpoints/step-00000030.h5", "r")
def compare(name, item):
    if isinstance(item, h5py.Dataset):
        assert np.array_equal(item[()], y[name][()]), name
x.visititems(compare)
PY
  fail "pairing linear and its activation changed the results"

# More threads than cores in a rank's affinity mask (what srun without --cpus-per-task gives each rank since Slurm
# 22.05): one start-up warning that names the rank; none when the threads fit. taskset gives the rank one core.
cores_run() {  # cores_run THREADS NAME: one rank on core 0
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=$1 taskset -c 0 timeout 120 $MPIEXEC -n 1 "$HPCTRAIN" train deck.toml --output "$2" \
    --set train.steps=2 --set precision.mode=fp32 >"$2.log" 2>&1 || { cat "$2.log" >&2; fail "$2: run failed"; }
}
cores_run 2 short
grep -q "^warning: rank 0 runs 2 threads on 1 core (its CPU affinity)" short.log &&
  pass "2 threads on 1 core: $(grep -o "^warning: rank 0 runs [^:]*" short.log)" || { cat short.log >&2; fail "no warning"; }
cores_run 1 fits
grep -q "threads on" fits.log && fail "1 thread on 1 core warned: $(grep "threads on" fits.log)" || pass "1 thread on 1 core: no warning"
finish
