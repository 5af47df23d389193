#!/usr/bin/env bash
# The data tools end to end: convert (.npy of several types and shapes, CSV) round-trips through h5py, split is a
# deterministic random partition, inspect's per-channel statistics match numpy, and plan prints PyTorch's
# DistributedSampler order (checked against torch itself when it is installed) with global batches that do not depend
# on the rank count.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"

$PYTHON - <<'PY'
import numpy as np
rng = np.random.default_rng(4)
np.save("images.npy", rng.integers(0, 256, (50, 3, 4, 5), dtype=np.uint8))
np.save("labels.npy", rng.integers(0, 10, 50).astype(np.int64))
np.save("half.npy", rng.standard_normal((50, 6)).astype(np.float16))
np.save("targets.npy", rng.standard_normal((50, 2)))
np.save("fortran.npy", np.asfortranarray(rng.standard_normal((5, 3)).astype(np.float32)))
with open("table.csv", "w") as f:
    f.write("a,b,kind,c\n")
    for i in range(40):
        f.write(f"{i * 0.5},{-i},{i % 4},{i * i}\n")
PY

# .npy -> HDF5, compressed: values, types and shapes survive
"$HPCTRAIN" data convert --features images.npy --labels labels.npy --output images.h5 --compress >convert.log \
  && grep -q "wrote images.h5: /features (50, 3, 4, 5) uint8, /labels (50) int32, gzip level 4 + shuffle" convert.log \
  && pass "convert .npy (uint8 images)" || { cat convert.log >&2; fail "convert .npy"; }
"$HPCTRAIN" data convert --features half.npy --targets targets.npy --output half.h5 >/dev/null || fail "convert float16"
"$HPCTRAIN" data convert --csv table.csv --header --label-column kind --output table.h5 >/dev/null || fail "convert csv"
$PYTHON - <<'PY' && pass "round trips through h5py" || fail "round trip values"
import h5py, numpy as np
with h5py.File("images.h5") as f:
    assert f["features"].dtype == np.uint8 and f["features"].shape == (50, 3, 4, 5)
    assert (f["features"][:] == np.load("images.npy")).all()
    assert f["labels"].dtype == np.int32 and (f["labels"][:] == np.load("labels.npy")).all()
    assert f["features"].compression == "gzip" and f["features"].shuffle
with h5py.File("half.h5") as f:
    assert f["features"].dtype == np.float16 and (f["features"][:] == np.load("half.npy")).all()
    assert np.allclose(f["targets"][:], np.load("targets.npy").astype(np.float32))
with h5py.File("table.h5") as f:
    x, y = f["features"][:], f["labels"][:]
    i = np.arange(40)
    assert x.shape == (40, 3) and (x == np.stack([i * 0.5, -i, i * i], 1).astype(np.float32)).all()
    assert (y == i % 4).all()
PY
expect_error npy_fortran_order "fortran.npy' stores its array in Fortran \(column-major\) order" 1 \
  data convert --features fortran.npy --labels labels.npy --output bad.h5
[[ ! -e bad.h5 && ! -e bad.h5.partial ]] && pass "no output left after a failed conversion" || fail "output left behind"

# split: a partition, deterministic per seed
"$HPCTRAIN" data split images.h5 --validation-fraction 0.2 --seed 3 --train-output a.h5 --validation-output b.h5 >/dev/null
"$HPCTRAIN" data split images.h5 --validation-fraction 0.2 --seed 3 --train-output c.h5 --validation-output d.h5 >/dev/null
"$HPCTRAIN" data split images.h5 --validation-fraction 0.2 --seed 4 --train-output e.h5 --validation-output f.h5 >/dev/null
$PYTHON - <<'PY' && pass "split: random partition, same seed same split" || fail "split"
import h5py, numpy as np
x = h5py.File("images.h5")["features"][:]
def rows(name):
    f = h5py.File(name)
    return [bytes(r) for r in f["features"][:]], f["labels"][:]
a, b = rows("a.h5"), rows("b.h5")
assert len(a[0]) == 40 and len(b[0]) == 10
assert sorted(a[0] + b[0]) == sorted(bytes(r) for r in x)
assert rows("d.h5")[0] == b[0] and rows("f.h5")[0] != b[0]
assert h5py.File("b.h5")["features"].dtype == np.uint8
PY

# inspect: per-channel statistics as numpy computes them
"$HPCTRAIN" data inspect images.h5 >inspect.log
$PYTHON - <<'PY' && pass "inspect: per-channel min/max/mean/std" || { cat inspect.log >&2; fail "inspect statistics"; }
import h5py, numpy as np, re
x = h5py.File("images.h5")["features"][:].astype(np.float64)
rows = {}
for line in open("inspect.log"):
    m = re.match(r"\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", line)
    if m: rows[int(m.group(1))] = [float(v) for v in m.groups()[1:]]
assert sorted(rows) == [0, 1, 2], rows
for c in range(3):
    v = x[:, c]
    expected = [v.min(), v.max(), v.mean(), v.std()]
    assert np.allclose(rows[c], expected, rtol=1e-6), (c, rows[c], expected)
PY

# plan: PyTorch's order; the global batch at a step is the same set for 1, 2 and 4 ranks
"$HPCTRAIN" data generate blobs --samples 100 --output blobs.h5 >/dev/null
cat >deck.toml <<'TOML'
[run]
seed = 5
[data]
train = "blobs.h5"
batch_size = 12
[model]
layers = [ { type = "linear", out = 3 } ]
[train]
steps = 1
TOML
for ranks in 1 2 4; do "$HPCTRAIN" data plan deck.toml --ranks $ranks --epoch 3 >plan-$ranks.txt || fail "plan $ranks"; done
"$HPCTRAIN" data plan deck.toml --ranks 3 --epoch 1 --set data.drop_last=true >plan-3.txt || fail "plan 3"
$PYTHON - <<'PY' && pass "plan: global batches independent of the rank count" || fail "plan global batches"
import re
def parse(name):
    steps = {}
    for line in open(name):
        m = re.match(r"step (\d+) rank (\d+):(.*)", line)
        if m: steps.setdefault(int(m.group(1)), {})[int(m.group(2))] = [int(v) for v in m.group(3).split()]
    return steps
plans = {r: parse(f"plan-{r}.txt") for r in (1, 2, 4)}
assert len(plans[1]) == 9  # ceil(100 / 12)
for step in range(8):
    batches = [sorted(sum(plans[r][step].values(), [])) for r in (1, 2, 4)]
    assert batches[0] == batches[1] == batches[2], step
assert sorted(sum((sum(s.values(), []) for s in plans[1].values()), [])) == list(range(100))
PY
if $PYTHON -c "import torch" 2>/dev/null; then
  $PYTHON - <<'PY' && pass "plan equals torch.utils.data.DistributedSampler" || fail "plan differs from PyTorch"
import re, torch
from torch.utils.data import DistributedSampler
for ranks, epoch, drop_last, name in ((4, 3, False, "plan-4.txt"), (3, 1, True, "plan-3.txt")):
    order = {}
    for line in open(name):
        m = re.match(r"step (\d+) rank (\d+):(.*)", line)
        if m: order.setdefault(int(m.group(2)), []).extend(int(v) for v in m.group(3).split())
    for rank in range(ranks):
        sampler = DistributedSampler(range(100), num_replicas=ranks, rank=rank, shuffle=True, seed=5, drop_last=drop_last)
        sampler.set_epoch(epoch)
        # With drop_last the last partial batch is not read either (as DataLoader(drop_last=True) does): a prefix.
        expected = list(sampler)[: 32 if drop_last else None]
        assert expected == order[rank], (ranks, rank)
PY
else
  echo "skip: torch not installed, plan not compared with torch itself"
fi
finish
