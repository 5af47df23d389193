#!/usr/bin/env bash
# The checkpoint layout that docs/file-formats.md's PyTorch example relies on: the deck attribute names every layer,
# /model/<name>/weight has PyTorch's (out, in) shape, and a NumPy forward pass with those tensors reproduces the run's
# final validation loss.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2000 1
make_spirals validation.h5 500 2
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 50
[model]
layers = [ { type = "linear", out = 16 }, { type = "layernorm", eps = 1e-4 }, { type = "leaky_relu", negative_slope = 0.2 },
           { type = "dropout", p = 0.1 }, { type = "linear", out = 12, name = "hidden" }, { type = "tanh" },
           { type = "gelu" }, { type = "linear", out = 12 }, { type = "gelu", approximate = "tanh" }, { type = "relu" },
           { type = "linear", out = 3 } ]
[train]
steps = 60
TOML
run_ranks 2 train deck.toml --output run >run.log 2>&1 || { cat run.log >&2; fail "training run"; }
$PYTHON - <<'PY' && pass "checkpoint layout and NumPy forward pass" || fail "layout check"
import math, tomllib, zlib, h5py, numpy as np
ckpt = h5py.File("run/checkpoints/step-00000060.h5", "r")
deck = tomllib.loads(ckpt.attrs["deck"])
x = h5py.File("validation.h5", "r")["/features"][()].astype(np.float64)
labels = h5py.File("validation.h5", "r")["/labels"][()]
erf = np.vectorize(math.erf)
width = x.shape[1]
for spec in deck["model"]["layers"]:
    name, kind = spec["name"], spec["type"]
    if kind == "linear":
        w, b = ckpt[f"/model/{name}/weight"][()], ckpt[f"/model/{name}/bias"][()]
        assert w.shape == (spec["out"], width), (name, w.shape)
        assert zlib.crc32(w.tobytes()) == ckpt[f"/model/{name}/weight"].attrs["crc32"]
        x = x @ w.T.astype(np.float64) + b
        width = spec["out"]
    elif kind == "layernorm":
        g, b = ckpt[f"/model/{name}/weight"][()], ckpt[f"/model/{name}/bias"][()]
        mean, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
        x = (x - mean) / np.sqrt(var + spec["eps"]) * g + b
    elif kind == "relu": x = np.maximum(x, 0)
    elif kind == "leaky_relu": x = np.where(x > 0, x, spec["negative_slope"] * x)
    elif kind == "tanh": x = np.tanh(x)
    elif kind == "gelu" and spec.get("approximate", "none") == "tanh":
        x = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    elif kind == "gelu": x = 0.5 * x * (1 + erf(x / math.sqrt(2)))
    elif kind == "dropout": pass
    else: raise AssertionError(kind)
assert "exp_avg" in ckpt["/optimizer"] and "exp_avg_sq" in ckpt["/optimizer"]
shifted = x - x.max(1, keepdims=True)
loss = np.mean(np.log(np.exp(shifted).sum(1)) - shifted[np.arange(len(labels)), labels])
reported = h5py.File("run/metrics.h5", "r")["/eval/loss"][-1]
print(f"NumPy loss {loss:.7f}, hpctrain's final validation loss {reported:.7f}")
assert abs(loss - reported) < 1e-5 * abs(reported), (loss, reported)
PY

# A tensor of more than 2^20 elements is read in several pieces, each checksummed as it comes (the CRC continued from
# piece to piece): a sound one loads, one damaged in its second piece is refused.
cat >wide.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 50
[model]
layers = [ { type = "linear", out = 600000 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 1
TOML
run_ranks 1 train wide.toml --output wide >wide.log 2>&1 || { cat wide.log >&2; fail "wide run"; }
cp -r wide wide-damaged
run_ranks 1 train wide.toml --output wide --set train.steps=2 --resume wide/checkpoints/step-00000001.h5 \
  >wide-resume.log 2>&1 && grep -q "resumed from" wide/train.log && pass "a tensor read in pieces loads" ||
  { cat wide-resume.log >&2; fail "wide resume"; }
$PYTHON - <<'PY' || fail "damaging the wide checkpoint"
import zlib, h5py
path = "wide-damaged/checkpoints/step-00000001.h5"
with h5py.File(path, "r") as ckpt:
    dataset = ckpt["/model/linear0/weight"]
    assert dataset.size > (1 << 20) + 1000, dataset.size
    assert zlib.crc32(dataset[()].tobytes()) == dataset.attrs["crc32"]
    offset = dataset.id.get_offset() + ((1 << 20) + 1000) * 4
with open(path, "r+b") as file:
    file.seek(offset)
    byte = file.read(1)
    file.seek(offset)
    file.write(bytes([byte[0] ^ 0x10]))
PY
if run_ranks 1 train wide.toml --output wide-damaged --set train.steps=2 \
  --resume wide-damaged/checkpoints/step-00000001.h5 >damaged.log 2>&1; then
  fail "a checkpoint damaged in a later piece was loaded"
else
  grep -q "linear0/weight fails its checksum" damaged.log && pass "damage in a later piece is found" ||
    { cat damaged.log >&2; fail "damaged wide checkpoint: message"; }
fi
finish
