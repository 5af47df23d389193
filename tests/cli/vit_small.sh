#!/usr/bin/env bash
# The small vision transformer deck (inputs/vit-small.toml: patch conv2d -> to_sequence with a class token and a
# position table -> 2 non-causal transformer_blocks -> layernorm -> sequence_pool -> linear on generated 3 x 32 x 32
# images of 8 classes), on fewer images than the deck's: 3 epochs on 2 ranks reach a validation accuracy far above
# chance (1/8), and evaluate/predict reproduce it from the checkpoint; 1 and 2 ranks give the same losses; a bf16 run
# interrupted and resumed on 2 ranks ends with the same checkpoint, bit for bit, as an uninterrupted one; the
# checkpoint names the class token and the position table, and PyTorch reproduces the validation figures from it
# (where torch is installed); a to_sequence after flatten fails with one clear message.
# The full deck's figure (0.96 after 3 epochs of 4000 images) is in its header and docs/getting-started.md, not
# measured here.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
mkdir data
"$HPCTRAIN" data generate images --samples 1200 --size 32 --channels 3 --classes 8 --seed 1 \
  --output data/images32-train.h5 >/dev/null
"$HPCTRAIN" data generate images --samples 400 --size 32 --channels 3 --classes 8 --seed 2 \
  --output data/images32-validation.h5 >/dev/null
cp "$HPCTRAIN_SOURCE_DIR"/inputs/vit-small.toml .

# 1. accuracy on 2 ranks (57 steps, about 10 s), then evaluate and predict on its checkpoint
run_ranks 2 train vit-small.toml --output run-accuracy >accuracy.log 2>&1 ||
  { cat accuracy.log >&2; fail "vit-small on 2 ranks"; }
grep -q "to_sequence1  *to_sequence  *(N, 65, 64)  *4224" accuracy.log && pass "summary: to_sequence gives (N, 65, 64)" ||
  { cat accuracy.log >&2; fail "summary without to_sequence's shape and parameters"; }
grep -q "conv layers run channels-last" accuracy.log && pass "the patch conv runs channels-last before the encoder" ||
  fail "the conv stack of a vision transformer is not channels-last"
checkpoint=$(ls run-accuracy/checkpoints/step-*.h5 | tail -n 1)
run_ranks 2 evaluate "$checkpoint" --data data/images32-validation.h5 >evaluate.log 2>&1 ||
  { cat evaluate.log >&2; fail "evaluate on a vit-small checkpoint"; }
run_ranks 2 predict "$checkpoint" --data data/images32-validation.h5 --output predictions.h5 >predict.log 2>&1 ||
  { cat predict.log >&2; fail "predict on a vit-small checkpoint"; }
CHECKPOINT=$checkpoint $PYTHON - <<'PY' && pass "vit-small: accuracy far above chance; evaluate/predict agree" || fail "vit-small: accuracy, evaluate/predict or checkpoint names"
import os, re, h5py, numpy as np
accuracy = h5py.File("run-accuracy/metrics.h5", "r")["/eval/accuracy"][:]
trained = float(accuracy[-1])
print(f"vit-small validation accuracy after 3 epochs of 1200 images: {trained:.4f} (chance 0.125)")
assert trained >= 0.5, trained
printed = float(re.search(r"accuracy ([0-9.]+)", open("evaluate.log").read()).group(1))
with h5py.File("predictions.h5", "r") as p, h5py.File("data/images32-validation.h5", "r") as d:
    key = [k for k in p.keys() if k in ("predictions", "labels", "classes", "logits")]
    values = p[key[0]][()]
    predicted = values.argmax(1) if values.ndim == 2 else values
    from_predictions = float(np.mean(predicted == d["labels"][()]))
print(f"evaluate {printed:.4f}, predict ({key[0]}) {from_predictions:.4f}")
assert abs(printed - trained) < 1e-4 and abs(from_predictions - trained) < 1e-4
with h5py.File(os.environ["CHECKPOINT"], "r") as f:
    assert f["/model/to_sequence1/class_token"].shape == (64,), f["/model/to_sequence1/class_token"].shape
    assert f["/model/to_sequence1/position"].shape == (65, 64), f["/model/to_sequence1/position"].shape
PY

# 1b. PyTorch (f64) reads the checkpoint and reproduces the validation loss and accuracy: the patches as timm's
# PatchEmbed orders them (x.flatten(2).transpose(1, 2)), the class token first, GPT-2's blocks without the causal mask.
# Where torch is installed (HPCTRAIN_TORCH_VENV, or bench/.venv as bench/install-torch.sh makes it, or $PYTHON).
torch_python=${HPCTRAIN_TORCH_VENV:-$HPCTRAIN_SOURCE_DIR/bench/.venv}/bin/python
[[ -x $torch_python ]] || torch_python=$PYTHON
if "$torch_python" -c 'import torch, h5py' 2>/dev/null; then
  "$torch_python" - run-accuracy data/images32-validation.h5 <<'PY' && pass "PyTorch reproduces vit-small's validation figures" || fail "PyTorch does not reproduce the validation figures"
import glob, sys, h5py, torch
import torch.nn.functional as F
run, data = sys.argv[1], sys.argv[2]
path = sorted(glob.glob(f"{run}/checkpoints/step-*.h5"))[-1]
with h5py.File(path, "r") as f:
    p = {}
    f["/model"].visititems(lambda n, d: p.__setitem__(n, torch.from_numpy(d[()]).double()) if isinstance(d, h5py.Dataset) else None)
with h5py.File(data, "r") as f:
    x, y = torch.from_numpy(f["features"][()]).double(), torch.from_numpy(f["labels"][()]).long()

def layernorm(h, name):
    return F.layer_norm(h, h.shape[-1:], p[f"{name}/weight"], p[f"{name}/bias"], 1e-5)

def block(h, name, heads=4):
    a = layernorm(h, f"{name}.ln_1")
    qkv = F.linear(a, p[f"{name}.attn/c_attn.weight"], p[f"{name}.attn/c_attn.bias"])
    n, t, c3 = qkv.shape
    q, k, v = (z.view(n, t, heads, -1).transpose(1, 2) for z in qkv.split(c3 // 3, dim=2))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=False).transpose(1, 2).reshape(n, t, -1)
    h = h + F.linear(a, p[f"{name}.attn/c_proj.weight"], p[f"{name}.attn/c_proj.bias"])
    m = F.gelu(F.linear(layernorm(h, f"{name}.ln_2"), p[f"{name}.c_fc/weight"], p[f"{name}.c_fc/bias"]), approximate="tanh")
    return h + F.linear(m, p[f"{name}.c_proj/weight"], p[f"{name}.c_proj/bias"])

with torch.no_grad():
    h = F.conv2d(x, p["conv2d0/weight"], p["conv2d0/bias"], stride=4)    # (N, 64, 8, 8)
    h = h.flatten(2).transpose(1, 2)                                       # (N, 64 patches, 64): timm's PatchEmbed
    h = torch.cat([p["to_sequence1/class_token"].expand(h.shape[0], 1, -1), h], dim=1) + p["to_sequence1/position"]
    h = block(block(h, "transformer_block2"), "transformer_block3")
    logits = F.linear(layernorm(h, "layernorm4")[:, 0], p["linear6/weight"], p["linear6/bias"])
loss = F.cross_entropy(logits, y).item()
accuracy = (logits.argmax(1) == y).double().mean().item()
metrics = h5py.File(f"{run}/metrics.h5", "r")
theirs_loss, theirs_accuracy = float(metrics["/eval/loss"][-1]), float(metrics["/eval/accuracy"][-1])
print(f"PyTorch (f64) validation loss {loss:.6f} accuracy {accuracy:.4f}; hpctrain {theirs_loss:.6f} {theirs_accuracy:.4f}")
assert abs(loss - theirs_loss) <= 1e-4 * abs(theirs_loss) and abs(accuracy - theirs_accuracy) <= 1e-4, (loss, theirs_loss)
PY
else
  echo "skipped: PyTorch cross-check (no torch with h5py for $torch_python)"
fi

# 2. rank invariance: 1 and 2 ranks, the same global batches
short=(--set train.epochs=0 --set train.steps=10 --set train.log_every=1 --set train.eval_every=5)
for ranks in 1 2; do
  run_ranks $ranks train vit-small.toml --output ranks-$ranks "${short[@]}" >ranks-$ranks.log 2>&1 ||
    { cat ranks-$ranks.log >&2; fail "vit-small on $ranks ranks"; }
done
$PYTHON - <<'PY' && pass "vit-small: 1 and 2 ranks give the same losses" || fail "vit-small: rank invariance"
import h5py, numpy as np
runs = {r: h5py.File(f"ranks-{r}/metrics.h5", "r") for r in (1, 2)}
for key in ("/train/loss", "/eval/loss", "/eval/accuracy"):
    a, b = runs[1][key][:], runs[2][key][:]
    assert len(a) == len(b) > 0 and np.all(np.isfinite(a)), (key, a, b)
    rel = np.abs(a - b).max() / np.abs(a).max()
    print(f"{key}: {len(a)} values, largest relative difference {rel:.2e}")
    assert rel <= 1e-5, (key, rel)
PY

# 3. exact resume, bf16 on 2 ranks: 6 steps, then resumed to 12, against 12 in one go
common=(--set train.epochs=0 --set train.log_every=3 --set 'data.validation=""' --set precision.mode=bf16)
run_ranks 2 train vit-small.toml --output resume-full "${common[@]}" --set train.steps=12 >/dev/null 2>&1 ||
  fail "resume: full run"
run_ranks 2 train vit-small.toml --output resume-part "${common[@]}" --set train.steps=6 >/dev/null 2>&1 ||
  fail "resume: first half"
run_ranks 2 train vit-small.toml --output resume-part "${common[@]}" --set train.steps=12 --resume auto >resume.log 2>&1 ||
  { cat resume.log >&2; fail "resume: second half"; }
$PYTHON "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/same_datasets.py" resume-full/checkpoints/step-00000012.h5 \
  resume-part/checkpoints/step-00000012.h5 &&
  pass "vit-small bf16: exact resume" || fail "vit-small: resumed state differs"

# 4. to_sequence needs a feature map
expect_error to-sequence-after-flatten \
  "layer 'to_sequence2' \(to_sequence\) receives samples of shape \(N, 4096\), not a feature map" 2 \
  train vit-small.toml --output bad \
  --set 'model.layers=[{type="conv2d", out=64, kernel=4, stride=4}, {type="flatten"}, {type="to_sequence"}]'
finish
