#!/usr/bin/env bash
# evaluate and predict on token data, and reading a GPT checkpoint outside hpctrain, on a short run of
# inputs/gpt-tiny.toml (GPL-3, 2 transformer blocks, tied head):
# 1. evaluate on 1 and 2 ranks gives the validation loss and accuracy training reported for the same checkpoint (and
#    in bf16);
# 2. predict (1 and 2 ranks) writes per window and position the argmax and log p(target): -mean(log p) is that loss,
#    mean(argmax == target) that accuracy, the targets are the file's next tokens;
# 3. a NumPy forward pass (float64) built from the checkpoint's deck and tensor names reproduces the loss, and where
#    PyTorch is installed, docs/file-formats.md's GPT loader does too (run from the page), on it and on a model of
#    residual/attention layers with an untied head;
# 4. a window length other than the model's, and a features file, are refused with one message.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_gpl3_tokens
cp "$HPCTRAIN_SOURCE_DIR"/inputs/gpt-tiny.toml .
# 40 steps, evaluated once at the end (the checkpoint written at the end is of the same step); an eval batch that
# does not divide the validation windows (54 of GPL-3), so both ranks end on a partial batch
run_ranks 2 train gpt-tiny.toml --output runs/gpt-tiny --set train.steps=40 --set train.eval_every=0 \
  --set data.eval_batch_size=12 >train.log 2>&1 || { cat train.log >&2; fail "training gpt-tiny"; }
checkpoint=runs/gpt-tiny/checkpoints/step-00000040.h5

# 1. evaluate
for ranks in 1 2; do
  run_ranks $ranks evaluate runs/gpt-tiny --data data/gpl3-validation.h5 --output evaluation-$ranks.h5 \
    >evaluate-$ranks.log 2>&1 || { cat evaluate-$ranks.log >&2; fail "evaluate on $ranks ranks"; }
  cat evaluate-$ranks.log
done
# the validation file's windows, (tokens - 1) / 64 (54 for Debian's GPL-3), each of 64 scored positions
windows=$($PYTHON -c 'import h5py; print((h5py.File("data/gpl3-validation.h5", "r")["/tokens"].shape[0] - 1) // 64)')
export windows
grep -qE "\($windows windows, $((windows * 64)) positions scored\): loss [0-9.]+  accuracy [0-9.]+  top-5 [0-9.]+" \
  evaluate-2.log &&
  pass "evaluate names the windows and positions it scored" || fail "evaluate's summary line"
$PYTHON - <<'PY' && pass "evaluate on 1 and 2 ranks = training's validation loss and accuracies" || fail "evaluate differs from training's validation figures"
import os, h5py, numpy as np
metrics = h5py.File("runs/gpt-tiny/metrics.h5", "r")
assert metrics["/eval/step"][-1] == 40, metrics["/eval/step"][()]
for ranks in (1, 2):
    e = h5py.File(f"evaluation-{ranks}.h5", "r")
    windows = int(os.environ["windows"])
    assert e["/eval/samples"][0] == windows and e["/eval/positions"][0] == windows * 64, (windows, e["/eval/positions"][0])
    for name in ("loss", "accuracy", "top5_accuracy"):
        mine, trained = e[f"/eval/{name}"][0], metrics[f"/eval/{name}"][-1]
        print(f"{ranks} rank(s): {name} {mine:.9f}, training reported {trained:.9f}")
        assert np.isfinite(mine) and abs(mine - trained) <= 1e-7 * abs(trained), (name, mine, trained)
PY

# ... and in bf16 (activations and logits in bf16; the loss summed in fp32/fp64 as in training): equal on the rank count
# training evaluated on, within bf16's rounding of batches split otherwise on 1 rank.
run_ranks 2 train gpt-tiny.toml --output runs/gpt-bf16 --set train.steps=10 --set train.eval_every=0 \
  --set data.eval_batch_size=12 --set precision.mode=bf16 >train-bf16.log 2>&1 || { cat train-bf16.log >&2; fail "bf16 run"; }
for ranks in 1 2; do
  run_ranks $ranks evaluate runs/gpt-bf16 --data data/gpl3-validation.h5 --output evaluation-bf16-$ranks.h5 \
    >evaluate-bf16-$ranks.log 2>&1 || { cat evaluate-bf16-$ranks.log >&2; fail "bf16 evaluate on $ranks ranks"; }
done
$PYTHON - <<'PY' && pass "bf16: evaluate = training's validation loss (2 ranks: 1e-7, 1 rank: 1e-4)" || fail "bf16 evaluate"
import h5py
trained = h5py.File("runs/gpt-bf16/metrics.h5", "r")["/eval/loss"][-1]
for ranks, tolerance in ((2, 1e-7), (1, 1e-4)):
    mine = h5py.File(f"evaluation-bf16-{ranks}.h5", "r")["/eval/loss"][0]
    print(f"bf16, {ranks} rank(s): {mine:.9f}, training reported {trained:.9f}")
    assert abs(mine - trained) <= tolerance * trained, (ranks, mine, trained)
PY

# 2. predict
for ranks in 1 2; do
  run_ranks $ranks predict "$checkpoint" --data data/gpl3-validation.h5 --output predictions-$ranks.h5 \
    >predict-$ranks.log 2>&1 || { cat predict-$ranks.log >&2; fail "predict on $ranks ranks"; }
done
grep -q "wrote predictions for $windows windows of 64 tokens to predictions-2.h5" predict-2.log ||
  { cat predict-2.log >&2; fail "predict's summary line"; }
$PYTHON - <<'PY' && pass "predict: argmax and log p(target) per position agree with evaluate" || fail "predict's token outputs"
import os, h5py, numpy as np
e = h5py.File("evaluation-2.h5", "r")
tokens = h5py.File("data/gpl3-validation.h5", "r")["/tokens"][()].astype(np.int64)
n = int(os.environ["windows"])
windows = tokens[np.arange(n)[:, None] * 64 + np.arange(65)]
runs = {r: h5py.File(f"predictions-{r}.h5", "r") for r in (1, 2)}
for ranks, p in runs.items():
    log_p, guesses, targets = p["/target_log_probabilities"][()], p["/next_tokens"][()], p["/targets"][()]
    assert log_p.shape == guesses.shape == targets.shape == (n, 64), (log_p.shape, guesses.shape, targets.shape)
    assert log_p.dtype == np.float32 and guesses.dtype == np.int32 and targets.dtype == np.int32
    assert np.array_equal(p["/indices"][()], np.arange(n)) and np.array_equal(targets, windows[:, 1:])
    assert np.all(np.isfinite(log_p)) and np.all(log_p <= 0) and np.all((guesses >= 0) & (guesses < 256))
    loss, accuracy = -log_p.astype(np.float64).mean(), np.mean(guesses == targets)
    print(f"{ranks} rank(s): predictions give loss {loss:.7f} accuracy {accuracy:.6f}; "
          f"evaluate: {e['/eval/loss'][0]:.7f} {e['/eval/accuracy'][0]:.6f}")
    assert abs(loss - e["/eval/loss"][0]) <= 1e-5 * e["/eval/loss"][0], loss
    assert abs(accuracy - e["/eval/accuracy"][0]) <= 1 / (n * 64), accuracy
gap = np.abs(runs[1]["/target_log_probabilities"][()] - runs[2]["/target_log_probabilities"][()]).max()
print(f"1 against 2 ranks: largest difference of log p {gap:.2e}")
assert gap <= 1e-4, gap
PY

# 3. NumPy (always) and PyTorch from the docs (where installed) against the validation loss
$PYTHON - "$checkpoint" <<'PY' && pass "a NumPy forward pass from the checkpoint's deck and names reproduces the loss" || fail "NumPy forward pass"
import math, sys, tomllib, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
deck, T = tomllib.loads(f.attrs["deck"]), int(f.attrs["input_features"])
w = lambda name: f[f"/model/{name}"][()].astype(np.float64)
tokens = h5py.File("data/gpl3-validation.h5", "r")["/tokens"][()].astype(np.int64)
windows = tokens[np.arange((len(tokens) - 1) // T)[:, None] * T + np.arange(T + 1)]
def layernorm(x, name, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w(f"{name}/weight") + w(f"{name}/bias")
def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
def attention(x, name, heads, causal):
    n, t, c = x.shape
    qkv = x @ w(f"{name}/c_attn.weight").T + w(f"{name}/c_attn.bias")
    q, k, v = (qkv[..., i * c:(i + 1) * c].reshape(n, t, heads, c // heads).transpose(0, 2, 1, 3) for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(c // heads)
    if causal:
        scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    y = (scores / scores.sum(-1, keepdims=True)) @ v
    return y.transpose(0, 2, 1, 3).reshape(n, t, c) @ w(f"{name}/c_proj.weight").T + w(f"{name}/c_proj.bias")
x = windows[:, :-1]
for spec in deck["model"]["layers"]:
    name, kind = spec["name"], spec["type"]
    if kind == "embedding":
        assert w(f"{name}/weight").shape == (spec["vocabulary"], spec["out"]) and w(f"{name}/position").shape == (T, spec["out"])
        x = w(f"{name}/weight")[x] + w(f"{name}/position")
    elif kind == "dropout":
        pass
    elif kind == "transformer_block":
        x = x + attention(layernorm(x, f"{name}.ln_1"), f"{name}.attn", spec["heads"], spec["causal"])
        h = gelu_tanh(layernorm(x, f"{name}.ln_2") @ w(f"{name}.c_fc/weight").T + w(f"{name}.c_fc/bias"))
        x = x + h @ w(f"{name}.c_proj/weight").T + w(f"{name}.c_proj/bias")
    elif kind == "layernorm":
        x = layernorm(x, name, spec.get("eps", 1e-5))
    elif kind == "linear":
        assert spec["tie"] == "embedding0" and f"/model/{name}/weight" not in f, "a tied head is stored once"
        x = x @ w(f"{spec['tie']}/weight").T
    else:
        raise AssertionError(kind)
x = x - x.max(-1, keepdims=True)
log_p = x - np.log(np.exp(x).sum(-1, keepdims=True))
loss = -np.take_along_axis(log_p, windows[:, 1:, None], -1).mean()
reported = h5py.File("runs/gpt-tiny/metrics.h5", "r")["/eval/loss"][-1]
print(f"NumPy (float64): validation loss {loss:.7f}; hpctrain reported {reported:.7f}")
assert abs(loss - reported) <= 1e-5 * reported, (loss, reported)
PY
torch_python=${HPCTRAIN_TORCH_VENV:-$HPCTRAIN_SOURCE_DIR/bench/.venv}/bin/python
[[ -x $torch_python ]] && "$torch_python" -c 'import torch, h5py' 2>/dev/null || torch_python=$PYTHON
if "$torch_python" -c 'import torch, h5py' 2>/dev/null; then
  # The loader's other branches: the same blocks written as residual/attention layers, no position table, an untied
  # head with a bias, exact GELU.
  cat >branches.toml <<'TOML'
[data]
train = "data/gpl3-train.h5"
validation = "data/gpl3-validation.h5"
batch_size = 16
[model]
layers = [
  {type = "embedding", vocabulary = 256, out = 32},
  {type = "residual", name = "attn0", layers = [{type = "layernorm", eps = 1e-4}, {type = "attention", heads = 2}]},
  {type = "residual", name = "mlp0", layers = [
    {type = "layernorm"}, {type = "linear", out = 64}, {type = "gelu"}, {type = "dropout", p = 0.1},
    {type = "linear", out = 32}]},
  {type = "layernorm"},
  {type = "linear", out = 256},
]
[optimizer]
lr = 0.003
[train]
steps = 10
TOML
  run_ranks 2 train branches.toml --output runs/branches >branches.log 2>&1 || { cat branches.log >&2; fail "branches run"; }
  # The page's block as a reader runs it (in a directory with runs/gpt-tiny and data/gpl3-validation.h5), then its
  # loader on the second run.
  if "$torch_python" - "$HPCTRAIN_SOURCE_DIR/docs/file-formats.md" <<'PY'; then
import sys
doc = open(sys.argv[1]).read()
block = doc[doc.index("```python", doc.index("### Loading a GPT checkpoint")):]
exec(block[len("```python"):block.index("```", 3)])
model = load_hpctrain_language_model("runs/branches/checkpoints/step-00000010.h5").eval()
assert sorted(name for name, _ in model.named_parameters()) == sorted(
    ["embedding0.weight", "attn0.layernorm0.weight", "attn0.layernorm0.bias", "attn0.attention1.c_attn.weight",
     "attn0.attention1.c_attn.bias", "attn0.attention1.c_proj.weight", "attn0.attention1.c_proj.bias",
     "mlp0.layernorm0.weight", "mlp0.layernorm0.bias", "mlp0.linear1.weight", "mlp0.linear1.bias",
     "mlp0.linear4.weight", "mlp0.linear4.bias", "layernorm3.weight", "layernorm3.bias", "linear4.weight",
     "linear4.bias"]), [name for name, _ in model.named_parameters()]
with torch.no_grad():
    logits = model(windows[:, :-1])
loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
reported = h5py.File("runs/branches/metrics.h5", "r")["/eval/loss"][-1]
print(f"residual/attention blocks, untied head: PyTorch {loss:.6f}, hpctrain {reported:.6f}")
assert abs(loss - reported) <= 1e-4 * reported, (loss, reported)
PY
    pass "docs/file-formats.md's GPT loader reproduces the validation loss in PyTorch (transformer blocks; residual blocks)"
  else
    fail "docs/file-formats.md's GPT loader"
  fi
else
  echo "skipped: the PyTorch GPT loader (no torch for $torch_python; the NumPy check above ran)"
fi

# 4. refusals
"$HPCTRAIN" data convert --text "$licence" --sequence-length 32 --output data/gpl3-32.h5 >/dev/null
expect_error window-length "windows of 32 tokens, but the model in .* reads windows of 64 tokens" \
  2 evaluate "$checkpoint" --data data/gpl3-32.h5
# the hint's way out: the same file cut into the model's windows
hint=$(grep "hint:" window-length.log | grep -o -- "--set data.sequence_length=[0-9]*") || fail "no --set in the hint"
run_ranks 2 evaluate "$checkpoint" --data data/gpl3-32.h5 $hint >rewindowed.log 2>&1 &&
  grep -q "($((($(stat -c %s $licence) - 1) / 64)) windows, " rewindowed.log && pass "the hint ($hint) works" ||
  { cat rewindowed.log >&2; fail "evaluate with the hint's $hint"; }
make_spirals spirals.h5 64
expect_error features-to-gpt "spirals.h5': samples of 2 features, but the model in .* is a language model" 2 predict "$checkpoint" \
  --data spirals.h5 --output refused.h5
[[ ! -e refused.h5 ]] && pass "nothing written on a refusal" || fail "refused.h5 exists"
finish
