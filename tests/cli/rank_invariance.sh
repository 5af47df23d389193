#!/usr/bin/env bash
# The same deck (fixed global batch, shuffling, dropout, layernorm) on 1, 2 and 4 ranks: the loss after 50 steps agrees
# to 1e-4 relative, because the global batches, the dropout masks and the initial weights do not depend on the rank
# count. A residual MLP gives the same losses on 1 and 2 ranks.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 4096 1
cat >deck.toml <<'TOML'
[run]
seed = 7
[data]
train = "train.h5"
batch_size = 64
[model]
layers = [
  { type = "linear", out = 32 }, { type = "layernorm" }, { type = "gelu" }, { type = "dropout", p = 0.1 },
  { type = "linear", out = 32 }, { type = "tanh" }, { type = "linear", out = 3 },
]
[optimizer]
type = "adamw"
lr = 0.01
weight_decay = 0.01
grad_clip = 1.0
[train]
steps = 50
log_every = 50
TOML
for ranks in 1 2 4; do
  run_ranks $ranks train deck.toml --output run-$ranks >run-$ranks.log 2>&1 || { cat run-$ranks.log >&2; fail "run on $ranks ranks"; }
done
$PYTHON - <<'PY' || fail "losses differ between rank counts"
import h5py, numpy as np
losses = {r: h5py.File(f"run-{r}/metrics.h5", "r")["/train/loss"][:] for r in (1, 2, 4)}
for r in (2, 4):
    assert len(losses[r]) == 50, (r, len(losses[r]))
    rel = abs(losses[r][-1] - losses[1][-1]) / abs(losses[1][-1])
    print(f"ranks {r}: final loss {losses[r][-1]:.8f} vs {losses[1][-1]:.8f} (1 rank): relative difference {rel:.2e}")
    assert rel < 1e-4, rel
    assert np.all(np.isfinite(losses[r]))
assert losses[1][-1] < losses[1][0], "the loss did not decrease"
PY

# A residual MLP (two blocks, one with layernorm, tanh-GELU and dropout in its branch): 1 and 2 ranks agree too.
cat >residual.toml <<'TOML'
[run]
seed = 3
[data]
train = "train.h5"
batch_size = 64
[model]
layers = [
  { type = "linear", out = 32 },
  { type = "residual", layers = [ { type = "linear", out = 32 }, { type = "relu" }, { type = "linear", out = 32 } ] },
  { type = "residual", layers = [ { type = "layernorm" }, { type = "linear", out = 64 },
                                  { type = "gelu", approximate = "tanh" }, { type = "dropout", p = 0.1 },
                                  { type = "linear", out = 32 } ] },
  { type = "linear", out = 3 },
]
[optimizer]
lr = 0.01
[train]
steps = 30
log_every = 30
TOML
for ranks in 1 2; do
  run_ranks $ranks train residual.toml --output residual-$ranks >residual-$ranks.log 2>&1 ||
    { cat residual-$ranks.log >&2; fail "residual MLP on $ranks ranks"; }
done
$PYTHON - <<'PY' || fail "residual MLP losses differ between 1 and 2 ranks"
import h5py, numpy as np
one, two = (h5py.File(f"residual-{r}/metrics.h5", "r")["/train/loss"][:] for r in (1, 2))
rel = abs(two[-1] - one[-1]) / abs(one[-1])
print(f"residual MLP: final loss {two[-1]:.8f} (2 ranks) vs {one[-1]:.8f} (1 rank): relative difference {rel:.2e}")
assert len(one) == len(two) == 30 and np.all(np.isfinite(one)) and rel < 1e-4, rel
assert one[-1] < one[0], "the loss did not decrease"
PY
finish
