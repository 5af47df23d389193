#!/usr/bin/env bash
# Forced overflow in fp16: a huge initial loss scale makes the first steps overflow. Each such step is skipped on every
# rank and halves the scale; then training continues with finite weights, and the scale doubles after growth_interval
# finite steps in a row (PyTorch GradScaler semantics). Also: a run whose scale collapses stops with a clear message,
# and a NaN loss in fp32 stops the run naming the step.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2048 1
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 64
[model]
layers = [ { type = "linear", out = 32 }, { type = "relu" }, { type = "linear", out = 3 } ]
[optimizer]
lr = 0.01
[train]
steps = 60
log_every = 10
[precision]
mode = "fp16"
init_scale = 1.0e12
growth_interval = 10
TOML
run_ranks 2 train deck.toml --output overflow >overflow.log 2>&1 || { cat overflow.log >&2; fail "overflow run failed"; }
$PYTHON - <<'PY' || fail "loss-scale trajectory wrong"
import h5py, numpy as np
with h5py.File("overflow/metrics.h5", "r") as f:
    scale, skipped, loss = f["/train/loss_scale"][:], f["/train/skipped"][:], f["/train/loss"][:]
k = int(np.argmin(skipped))  # first finite step
print(f"{k} skipped steps, scale {scale[0]:.3g} -> {scale[k]:.3g}; final loss {loss[-1]:.4f}")
assert k >= 2 and skipped[:k].all(), skipped[:k + 1]
for i in range(k):
    assert scale[i + 1] == scale[i] * 0.5, (i, scale[i], scale[i + 1])
# growth: after 10 finite steps in a row the scale doubles (if nothing overflowed in between)
run = 0
for i in range(k, len(scale) - 1):
    if skipped[i]:
        assert scale[i + 1] == scale[i] * 0.5
        run = 0
        continue
    run += 1
    expected = scale[i] * 2 if run == 10 else scale[i]
    if run == 10: run = 0
    assert scale[i + 1] == expected, (i, scale[i], scale[i + 1], run)
assert np.isfinite(loss[k:]).all() and loss[-1] < loss[k], (loss[k], loss[-1])
PY
expect_error scale_collapse "loss scale collapsed" 2 train deck.toml --output collapse --set precision.init_scale=1e30 \
  --set precision.max_skipped_steps=3 --set precision.backoff_factor=0.9
expect_error nan_loss_fp32 "became NaN/Inf at step [0-9]+" 2 train deck.toml --output diverge --set precision.mode=fp32 \
  --set optimizer.lr=1e30
[[ -f diverge/metrics.h5 ]] && pass "metrics.h5 kept after the NaN stop" || fail "no metrics.h5 after the NaN stop"
finish
