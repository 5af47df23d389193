#!/usr/bin/env bash
# A byte-level language model with self-attention (issue 16): embedding (with positions) -> attention -> layernorm ->
# linear on GPL-3 gives the same losses on 1 and 2 ranks; the same model without the position table ends with a
# validation loss below the attention-free bigram model's (embedding -> layernorm -> linear) after as many steps; a
# transformer_block with attention dropout and residual dropout gives the same losses on 1 and 2 ranks (the masks follow
# the global samples, not the ranks); the deck errors of the attention layer. (With the position table at PyTorch's nn.Embedding init, normal(0, 1), and no
# residual path, the model overfits this small text: its validation accuracy beats the bigram's, its loss does not.)
# One thread per rank: these models are small enough that more threads only wait on each other.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
licence=/usr/share/common-licenses/GPL-3
[[ -r $licence ]] || { echo "skipped: $licence is missing"; exit 77; }
"$HPCTRAIN" data convert --text "$licence" --validation-fraction 0.1 --validation-output val.h5 --output train.h5 \
  --sequence-length 64 >convert.log 2>&1 || { cat convert.log >&2; fail "convert --text"; }

cat >attention.toml <<'TOML'
[run]
seed = 3
threads = 1
[data]
train = "train.h5"
validation = "val.h5"
batch_size = 16
[model]
layers = [ { type = "embedding", vocabulary = 256, out = 64, positions = true },
           { type = "attention", heads = 4, causal = true },
           { type = "layernorm" },
           { type = "linear", out = 256 } ]
[optimizer]
lr = 0.01
[train]
steps = 100
log_every = 50
eval_every = 50
TOML
for ranks in 1 2; do
  run_ranks $ranks train attention.toml --output attention-$ranks >attention-$ranks.log 2>&1 ||
    { cat attention-$ranks.log >&2; fail "train with attention on $ranks ranks"; }
done
grep -q "attention1      attention       (N, 64, 64)             16640" attention-1.log &&
  pass "summary: c_attn (192 x 64, 192) and c_proj (64 x 64, 64) counted" ||
  { cat attention-1.log >&2; fail "summary with attention"; }
$PYTHON - <<'PY' && pass "attention: 1 and 2 ranks give the same losses; GPT-2's parameter names" || fail "attention losses"
import h5py, numpy as np
runs = {r: h5py.File(f"attention-{r}/metrics.h5", "r") for r in (1, 2)}
for key in ("/train/loss", "/eval/loss"):
    a, b = runs[1][key][:], runs[2][key][:]
    assert len(a) == len(b) and len(a) > 0 and np.all(np.isfinite(a)), (key, a, b)
    assert np.abs(a - b).max() / np.abs(a).max() <= 1e-5, (key, np.abs(a - b).max())
with h5py.File("attention-1/checkpoints/step-00000100.h5", "r") as f:
    shapes = {name: f[f"/model/attention1/{name}"].shape for name in f["/model/attention1"]}
assert shapes == {"c_attn.weight": (192, 64), "c_attn.bias": (192,), "c_proj.weight": (64, 64), "c_proj.bias": (64,)}, shapes
PY

# Dropout on the attention probabilities (inside the fused kernel) and at the end of both residual branches.
block='{type="transformer_block", name="h0", heads=4, dropout=0.2, residual_dropout=0.1}'
dropout_layers="{type=\"embedding\", vocabulary=256, out=64, positions=true}, $block, {type=\"layernorm\"}, {type=\"linear\", out=256}"
for ranks in 1 2; do
  run_ranks $ranks train attention.toml --set train.steps=30 --set train.log_every=10 --set train.eval_every=30 \
    --set "model.layers=[$dropout_layers]" --output dropout-$ranks >dropout-$ranks.log 2>&1 ||
    { cat dropout-$ranks.log >&2; fail "train with attention dropout on $ranks ranks"; }
done
grep -q "h0.resid_dropout_2" dropout-1.log && pass "residual_dropout: a dropout layer ends each branch" ||
  { cat dropout-1.log >&2; fail "summary with residual dropout"; }
$PYTHON - <<'PY' && pass "attention dropout: 1 and 2 ranks give the same losses" || fail "attention dropout losses"
import h5py, numpy as np
runs = {r: h5py.File(f"dropout-{r}/metrics.h5", "r") for r in (1, 2)}
for key in ("/train/loss", "/eval/loss"):
    a, b = runs[1][key][:], runs[2][key][:]
    assert len(a) == len(b) and len(a) > 0 and np.all(np.isfinite(a)), (key, a, b)
    assert np.abs(a - b).max() / np.abs(a).max() <= 1e-5, (key, np.abs(a - b).max())
PY
# Generation is inference: the cached path (no dropout in it) and the recomputed one (Model::forward, not training)
# give the same greedy text; a mask leaking into either would change it.
for cache in "" --no-cache; do
  "$HPCTRAIN" generate dropout-1 --prompt "Copyright " --max-new-tokens 40 --temperature 0 $cache \
    >generated$cache.txt 2>generate.err || { cat generate.err >&2; fail "generate from the dropout model $cache"; }
done
[[ -s generated.txt ]] && cmp -s generated.txt generated--no-cache.txt &&
  pass "generate from a model with attention dropout: cached and recomputed text agree" ||
  fail "generate with dropout: cached and recomputed differ"

steps=300
run_ranks 1 train attention.toml --set 'model.layers[0].positions=false' --set train.steps=$steps --output context \
  >context.log 2>&1 || { cat context.log >&2; fail "train with attention, no positions"; }
run_ranks 1 train attention.toml --set train.steps=$steps --output bigram \
  --set 'model.layers=[{type="embedding", vocabulary=256, out=64}, {type="layernorm"}, {type="linear", out=256}]' \
  >bigram.log 2>&1 || { cat bigram.log >&2; fail "train the bigram model"; }
$PYTHON - <<'PY' && pass "attention: validation loss below the bigram model's" || fail "attention against the bigram model"
import h5py, numpy as np
context, bigram = (h5py.File(f"{name}/metrics.h5", "r")["/eval/loss"][-1] for name in ("context", "bigram"))
print(f"final validation loss: attention {context:.4f} nats, bigram {bigram:.4f} nats")
assert np.isfinite(context) and context < bigram - 0.01, (context, bigram)
PY

# deck errors: heads that do not divide C, attention on feature vectors, dropout outside [0, 1)
expect_error heads-divide \
  "attention.toml:[0-9]+:[0-9]+: layer 'attention1' \(attention\) splits its width C = 64 into heads = 3 heads, which does not divide it" \
  1 train attention.toml --set 'model.layers[1].heads=3' --output bad1
make_spirals spirals.h5 64
expect_error attention-on-features "layer 'attention0' \(attention\) receives samples of shape \(N, 2\), not a sequence" 1 \
  train attention.toml --set 'data.train=["spirals.h5"]' --set 'data.validation=[]' \
  --set 'model.layers=[{type="attention", heads=1}, {type="linear", out=2}]' --output bad2
expect_error attention-dropout "model.layers\[1\].dropout.*in \[0, 1\)" 1 train attention.toml \
  --set 'model.layers[1].dropout=1.0' --output bad3
finish
