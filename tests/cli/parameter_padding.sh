#!/usr/bin/env bash
# Parameter tensors at 256-byte offsets in the flat buffers (the CUDA backend's layout), run on the CPU backend through
# HPCTRAIN_PARAMETER_ALIGNMENT=256: on 2 ranks, with weight decay, clipping, layernorm, a convolution and groupnorm,
# every metrics row and every checkpoint dataset equals the unpadded run's, and each layout resumes from the other's
# checkpoint (checkpoints store tensors, never the flat layout).
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
"$HPCTRAIN" data generate images --samples 256 --seed 1 --output images.h5 >/dev/null
cat >deck.toml <<'TOML'
[run]
seed = 4
[data]
train = "images.h5"
validation = "images.h5"
batch_size = 32
[model]
layers = [
  { type = "conv2d", out = 5, kernel = 3, padding = 1 }, { type = "groupnorm", groups = 5 }, { type = "relu" },
  { type = "maxpool2d", kernel = 2 }, { type = "flatten" }, { type = "linear", out = 13 }, { type = "layernorm" },
  { type = "gelu" }, { type = "linear", out = 4 },
]
[optimizer]
type = "adamw"
lr = 0.01
weight_decay = 0.1
grad_clip = 0.5
[train]
steps = 12
log_every = 3
eval_every = 6
[checkpoint]
every_steps = 6
TOML

run_ranks 2 train deck.toml --output plain >plain.log 2>&1 || { cat plain.log >&2; fail "unpadded run"; }
HPCTRAIN_PARAMETER_ALIGNMENT=256 run_ranks 2 train deck.toml --output padded >padded.log 2>&1 ||
  { cat padded.log >&2; fail "padded run"; }
grep -q "256-byte offsets" padded.log && pass "padded: $(grep -o 'total parameters.*' padded.log)" ||
  fail "the padded run did not pad (no '256-byte offsets' in its summary)"
grep -q "byte offsets" plain.log && fail "the unpadded run padded"
[[ $(grep -o 'total parameters: [0-9]*' plain.log) == $(grep -o 'total parameters: [0-9]*' padded.log) ]] &&
  pass "same parameter count in both summaries" || fail "parameter counts differ"

# Resume each layout from the other's step-6 checkpoint: the continuation equals the uninterrupted run.
HPCTRAIN_PARAMETER_ALIGNMENT=256 run_ranks 2 train deck.toml --output cross-padded \
  --resume plain/checkpoints/step-00000006.h5 >cross-padded.log 2>&1 || { cat cross-padded.log >&2; fail "padded resume"; }
run_ranks 2 train deck.toml --output cross-plain --resume padded/checkpoints/step-00000006.h5 >cross-plain.log 2>&1 ||
  { cat cross-plain.log >&2; fail "unpadded resume"; }

$PYTHON - <<'PY' || fail "padding changed a result"
import glob, os, h5py, numpy as np

def rows(run, group):
    with h5py.File(f"{run}/metrics.h5", "r") as f:
        return {name: f[group][name][:] for name in f[group] if name != "samples_per_sec"}

plain, padded = rows("plain", "train"), rows("padded", "train")
assert len(plain["loss"]) == 12, len(plain["loss"])
for name in plain:
    assert np.array_equal(plain[name], padded[name]), (name, plain[name], padded[name])
    assert not np.isnan(plain[name]).any(), name
for name, values in rows("plain", "eval").items():
    assert np.array_equal(values, rows("padded", "eval")[name]), name
print("12 steps: every train and eval metrics row identical")

kept = sorted(os.path.basename(p) for p in glob.glob("plain/checkpoints/step-*.h5"))
assert kept == sorted(os.path.basename(p) for p in glob.glob("padded/checkpoints/step-*.h5")) and kept, kept
for name in kept:
    a, b = h5py.File(f"plain/checkpoints/{name}", "r"), h5py.File(f"padded/checkpoints/{name}", "r")
    count = 0
    def compare(path, item):
        global count
        if isinstance(item, h5py.Dataset):
            assert path in b and item.shape == b[path].shape, path
            assert np.array_equal(item[()], b[path][()]), path
            count += 1
    a.visititems(compare)
    assert count > 10, count
print(f"checkpoints {kept}: every dataset identical")

for cross, reference in (("cross-padded", "plain"), ("cross-plain", "padded")):
    resumed, full = rows(cross, "train"), rows(reference, "train")
    assert len(resumed["loss"]) == 6, (cross, resumed["loss"])  # steps 7..12
    assert np.array_equal(resumed["loss"], full["loss"][6:]), (cross, resumed["loss"], full["loss"])
print("each layout resumed from the other's checkpoint and continued identically")
PY
finish
