#!/usr/bin/env bash
# The first sequence model (issue 16): a byte-level language model without attention (embedding -> layernorm ->
# linear over the vocabulary, the loss over every position) trained from a deck on a text converted by `data convert
# --text`: the same losses on 1 and 2 ranks, a final validation loss below the text's unigram entropy that `data
# inspect` prints (the model learns bigram statistics), a head tied to the embedding's table, and the deck errors of
# token data, embeddings and tied weights.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
licence=/usr/share/common-licenses/GPL-3
[[ -r $licence ]] || { echo "skipped: $licence is missing"; exit 77; }
"$HPCTRAIN" data convert --text "$licence" --validation-fraction 0.1 --validation-output val.h5 --output train.h5 \
  --sequence-length 64 >convert.log 2>&1 || { cat convert.log >&2; fail "convert --text"; }
"$HPCTRAIN" data inspect val.h5 >inspect.log 2>&1 || { cat inspect.log >&2; fail "inspect"; }

cat >lm.toml <<'TOML'
[run]
seed = 3
[data]
train = "train.h5"
validation = "val.h5"
batch_size = 16
[model]
layers = [ { type = "embedding", vocabulary = 256, out = 64 }, { type = "layernorm" }, { type = "linear", out = 256 } ]
[optimizer]
lr = 0.01
[train]
steps = 200
log_every = 50
eval_every = 100
TOML
for ranks in 1 2; do
  run_ranks $ranks train lm.toml --output run-$ranks >train-$ranks.log 2>&1 || { cat train-$ranks.log >&2; fail "train on $ranks ranks"; }
done
# with a learned position embedding: the same losses on 1 and 2 ranks too
for ranks in 1 2; do
  run_ranks $ranks train lm.toml --set 'model.layers[0].positions=true' --set train.steps=60 --output pos-$ranks \
    >pos-$ranks.log 2>&1 || { cat pos-$ranks.log >&2; fail "train with positions on $ranks ranks"; }
done
grep -q "embedding0      embedding       (N, 64, 64)             20480" pos-1.log &&
  pass "summary: the position table (64 x 64) counted" || { cat pos-1.log >&2; fail "summary with positions"; }
$PYTHON - <<'PY' && pass "positions: 1 and 2 ranks give the same losses" || fail "positions losses"
import h5py, numpy as np
a, b = (h5py.File(f"pos-{r}/metrics.h5", "r")["/train/loss"][:] for r in (1, 2))
assert len(a) == 60 and np.all(np.isfinite(a)) and len(b) == 60
assert np.abs(a - b).max() / np.abs(a).max() <= 1e-5, np.abs(a - b).max()
PY
# a tied head (GPT-2's LM head: the embedding's table as the linear weight), initialised as GPT-2 (model.init): the
# same losses on 1 and 2 ranks, the first near chance (small logits), the table stored once in the checkpoint (the
# head keeps only its bias)
tied='model.layers=[{type="embedding", vocabulary=256, out=64}, {type="layernorm"}, {type="linear", tie="embedding0"}]'
for ranks in 1 2; do
  run_ranks $ranks train lm.toml --set "$tied" --set model.init=gpt2 --set train.steps=40 --set train.eval_every=0 --output tied-$ranks \
    >tied-$ranks.log 2>&1 || { cat tied-$ranks.log >&2; fail "train tied on $ranks ranks"; }
done
grep -q "layer 'linear2' uses the table of 'embedding0' as its weight" tied-1.log &&
  pass "summary: the tied head named" || { cat tied-1.log >&2; fail "summary of the tied model"; }
$PYTHON - <<'PY' && pass "tied: 1 and 2 ranks give the same losses; the checkpoint holds the table once" || fail "tied head"
import glob, h5py, numpy as np
a, b = (h5py.File(f"tied-{r}/metrics.h5", "r")["/train/loss"][:] for r in (1, 2))
assert len(a) == 40 and np.all(np.isfinite(a)) and len(b) == 40
assert np.abs(a - b).max() / np.abs(a).max() <= 1e-5, np.abs(a - b).max()
assert abs(a[0] - np.log(256)) < 0.05 and a[-1] < a[0] - 1.0, (a[0], a[-1])
with h5py.File(sorted(glob.glob("tied-2/checkpoints/step-*.h5"))[-1], "r") as f:
    assert sorted(f["/model/linear2"]) == ["bias"], list(f["/model/linear2"])
    assert f["/model/embedding0/weight"].shape == (256, 64)
    state = f["/optimizer/exp_avg"]
    tables = [n for n in state for p in state[n] if state[n][p].shape == (256, 64)]
    assert tables == ["embedding0"] and sorted(state["linear2"]) == ["bias"], tables
PY

grep -q "embedding0      embedding       (N, 64, 64)             16384" train-1.log &&
  pass "summary: the embedding's (N, T, C) output and its table" || { cat train-1.log >&2; fail "summary"; }
$PYTHON - <<'PY' && pass "1 and 2 ranks: the same losses; validation loss below the unigram entropy" || fail "language model losses"
import re, h5py, numpy as np
entropy = float(re.search(r"\(([0-9.]+) nats", open("inspect.log").read()).group(1))
runs = {r: h5py.File(f"run-{r}/metrics.h5", "r") for r in (1, 2)}
train = {r: runs[r]["/train/loss"][:] for r in runs}
evals = {r: runs[r]["/eval/loss"][:] for r in runs}
assert len(train[1]) == 200 and np.all(np.isfinite(train[1])), train[1]
for a, b in ((train[1], train[2]), (evals[1], evals[2])):
    assert len(a) == len(b)
    rel = np.abs(a - b).max() / np.abs(a).max()
    assert rel <= 1e-5, rel
print(f"final validation loss {evals[1][-1]:.4f} nats, unigram entropy {entropy:.4f} nats, first train loss {train[1][0]:.4f}")
assert abs(train[1][0] - np.log(256)) < 1.5, train[1][0]  # starts near chance
assert evals[1][-1] < entropy - 0.3, (evals[1][-1], entropy)
PY

# deck errors: token data without an embedding, an embedding on features, an embedding not first, missing keys
expect_error no-embedding "holds token data \(494 windows of 64 tokens, vocabulary 256\), but the model's first layer 'linear0' \(linear\) does not take token ids" \
  2 train lm.toml --set 'model.layers=[{type="linear", out=256}]' --output bad1
make_spirals spirals.h5 64
expect_error embedding-on-features "first layer 'embedding0' is an embedding, but '.*spirals.h5' holds features" 1 train \
  lm.toml --set 'data.train=["spirals.h5"]' --set 'data.validation=[]' --output bad2
expect_error embedding-second "layer 'embedding1' \(embedding\) is layer 1 of the model.*must come first" 1 train lm.toml \
  --set 'model.layers=[{type="layernorm"}, {type="embedding", vocabulary=256, out=8}]' --output bad3
expect_error no-vocabulary "\(embedding\) needs vocabulary" 1 train lm.toml \
  --set 'model.layers=[{type="embedding", out=8}, {type="linear", out=256}]' --output bad4
expect_error small-vocabulary "vocabulary = 100 but the token ids of '.*train.h5' go up to 255" 1 train lm.toml \
  --set 'model.layers=[{type="embedding", vocabulary=100, out=8}, {type="linear", out=256}]' --output bad5
expect_error flattened-output "its output must be \(64, 256\) scored by cross_entropy" 1 train lm.toml \
  --set 'model.layers=[{type="embedding", vocabulary=256, out=8}, {type="flatten"}, {type="linear", out=256}]' --output bad6
expect_error pool-not-sequence "layer 'sequence_pool1' \(sequence_pool\) receives samples of shape \(N, 8\), not a sequence" 1 \
  train lm.toml --set 'data.train=["spirals.h5"]' --set 'data.validation=[]' --output bad11 \
  --set 'model.layers=[{type="linear", out=8}, {type="sequence_pool"}, {type="linear", out=2}]'
expect_error tie-missing "model.layers\[2\].tie = \"wte\" names no layer of the model" \
  1 train lm.toml --set "${tied/embedding0\"\}/wte\"\}}" --output bad7
expect_error tie-not-embedding "model.layers\[2\].tie = \"layernorm1\" names a layernorm layer" 1 train lm.toml \
  --set "${tied/tie=\"embedding0\"/tie=\"layernorm1\"}" --output bad8
expect_error tie-out "model.layers\[2\].out = 100, but the tied embedding 'embedding0' has vocabulary = 256" 1 train \
  lm.toml --set "${tied/tie=/out=100, tie=}" --output bad9
expect_error tie-width "layer 'linear2' ties its weight to the table of embedding 'embedding0', of shape \(256, 64\), but its weight is \(256, 32\)" \
  1 train lm.toml --set 'model.layers=[{type="embedding", vocabulary=256, out=64}, {type="linear", out=32}, {type="linear", tie="embedding0"}]' --output bad10
finish
