#!/usr/bin/env bash
# hpctrain generate (issue 16): a byte-level language model trained for 100 steps on a licence text continues a prompt.
# The same seed gives the same text, other seeds other text; greedy decoding (temperature 0) equals the argmax of a
# NumPy forward pass from the checkpoint's tensors, past the point where the window of T = 64 slides; the key/value
# cache gives what recomputing the window gives, for every model kind (position-wise layers, a transformer block); --output's
# file holds the ids and the options; and bad requests fail with one message each.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
# One rank starts without mpiexec (MPI's singleton start): generate runs on one rank, and mpiexec's start-up would be
# most of this test's time.
run_ranks() {
  local ranks=$1
  shift
  # shellcheck disable=SC2086
  if ((ranks == 1)); then timeout 120 "$HPCTRAIN" "$@"; else timeout 120 $MPIEXEC -n "$ranks" "$HPCTRAIN" "$@"; fi
}
licence=/usr/share/common-licenses/GPL-3
[[ -r $licence ]] || { echo "skipped: $licence is missing"; exit 77; }
"$HPCTRAIN" data convert --text "$licence" --output train.h5 --sequence-length 64 >convert.log 2>&1 ||
  { cat convert.log >&2; fail "convert --text"; }
cat >lm.toml <<'TOML'
[run]
seed = 3
[data]
train = "train.h5"
batch_size = 16
[model]
layers = [ { type = "embedding", vocabulary = 256, out = 64, positions = true }, { type = "layernorm" },
           { type = "linear", out = 256 } ]
[optimizer]
lr = 0.01
[train]
steps = 100
log_every = 100
TOML
run_ranks 1 train lm.toml --output run >train.log 2>&1 || { cat train.log >&2; fail "train"; }
# a second kind: no position table, an MLP with gelu and dropout on each position
mlp='[{type="embedding", vocabulary=256, out=32}, {type="linear", out=64}, {type="gelu"}, {type="dropout", p=0.1},
  {type="linear", out=256}]'
run_ranks 1 train lm.toml --output mlp --set train.steps=30 --set "model.layers=${mlp//$'\n'/}" >mlp.log 2>&1 ||
  { cat mlp.log >&2; fail "train the MLP kind"; }

# a third: a GPT block (residual blocks around a causal attention, whose keys and values the cache keeps, and an MLP)
attention='[{type="embedding", vocabulary=256, out=32, positions=true}, {type="transformer_block", heads=2},
  {type="layernorm"}, {type="linear", out=256}]'
run_ranks 1 train lm.toml --output attn --set train.steps=30 --set "model.layers=${attention//$'\n'/}" >attn.log 2>&1 ||
  { cat attn.log >&2; fail "train the attention kind"; }

generate() { "$HPCTRAIN" generate "$@" 2>generate.err; }
generate run --prompt "This program is " --max-new-tokens 100 --seed 7 >a.txt || fail "generate"
generate run --prompt "This program is " --max-new-tokens 100 --seed 7 >b.txt || fail "generate again"
generate run --prompt "This program is " --max-new-tokens 100 --seed 8 >c.txt || fail "generate, seed 8"
cmp -s a.txt b.txt && pass "the same seed gives the same text: $(head -c 60 a.txt | tr '\n' ' ')..." ||
  fail "seed 7 twice gave different text"
cmp -s a.txt c.txt && fail "seeds 7 and 8 gave the same text" || pass "another seed gives other text"
[[ $(head -c 16 a.txt) == "This program is " ]] && pass "the output starts with the prompt" || fail "prompt not echoed"

# the key/value cache against recomputing the window, the three models, sampled, top-k and greedy, before and after the
# window slides (16 + 100 > 64)
for model in run mlp attn; do
  for options in "--seed 1" "--seed 2 --top-k 5 --temperature 0.7" "--temperature 0"; do
    # shellcheck disable=SC2086
    generate $model --prompt "Copyright " --max-new-tokens 90 $options >cached.txt || fail "generate $model $options"
    # shellcheck disable=SC2086
    generate $model --prompt "Copyright " --max-new-tokens 90 $options --no-cache >uncached.txt ||
      fail "generate $model $options --no-cache"
    cmp -s cached.txt uncached.txt && pass "$model, $options: with and without the cache the same text" ||
      fail "$model, $options: the cache changes the text"
  done
done
[[ ! -s generate.err ]] && pass "no fallback notice for models the cache supports" || { cat generate.err >&2; fail "stderr"; }

# greedy against NumPy: the last position's logits from the checkpoint's tensors, the window the last 64 ids
generate run --prompt "The " --max-new-tokens 80 --temperature 0 --output greedy.h5 >greedy.txt || fail "greedy"
generate run --prompt-ids 84,104,101,32 --max-new-tokens 80 --temperature 0 >greedy-ids.txt || fail "greedy by ids"
cmp -s greedy.txt greedy-ids.txt && pass "--prompt-ids 84,104,101,32 is --prompt 'The '" || fail "ids and text differ"
$PYTHON - <<'PY' && pass "greedy decoding is the argmax of a NumPy forward pass; --output holds the ids and options" ||
import h5py, numpy as np
ckpt = h5py.File("run/checkpoints/step-00000100.h5", "r")
table, position = (ckpt[f"/model/embedding0/{n}"][()].astype(np.float64) for n in ("weight", "position"))
gamma, beta = (ckpt[f"/model/layernorm1/{n}"][()].astype(np.float64) for n in ("weight", "bias"))
weight, bias = (ckpt[f"/model/linear2/{n}"][()].astype(np.float64) for n in ("weight", "bias"))
out = h5py.File("greedy.h5", "r")
prompt, generated = out["/prompt"][()], out["/generated"][()]
assert out["/prompt"].dtype == np.int32 and out["/generated"].dtype == np.int32
assert list(prompt) == list(b"The "), prompt
assert len(generated) == 80
assert out.attrs["seed"] == 1 and out.attrs["temperature"] == 0.0 and out.attrs["top_k"] == 0
assert out.attrs["checkpoint"].endswith("step-00000100.h5"), out.attrs["checkpoint"]
ids = list(prompt)
for step in range(80):
    window = ids[-64:]
    x = table[window[-1]] + position[len(window) - 1]  # the last position (the model is position-wise)
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-5) * gamma + beta
    logits = weight @ x + bias
    top2 = np.sort(logits)[-2:]
    assert top2[1] - top2[0] > 1e-4, f"step {step}: a near tie {top2}"
    ids.append(int(np.argmax(logits)))
assert ids[4:] == list(generated), (ids[4:], list(generated))
text = open("greedy.txt", "rb").read()
assert text == bytes(ids) + b"\n", text  # the byte model's greedy text is printable here
PY
  fail "greedy against NumPy"

# errors: one message each, a non-zero exit
make_spirals spirals.h5 64
cat >mlp.toml <<'TOML'
[data]
train = "spirals.h5"
batch_size = 16
[model]
layers = [ { type = "linear", out = 8 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 2
TOML
run_ranks 1 train mlp.toml --output spirals-run >spirals.log 2>&1 || { cat spirals.log >&2; fail "train spirals"; }
expect_error not-a-token-model "first layer 'linear0' takes features, not token ids" 1 generate spirals-run --prompt a \
  --max-new-tokens 3
run_ranks 1 train lm.toml --output encoder --set train.steps=1 --set \
  'model.layers=[{type="embedding", vocabulary=256, out=8}, {type="attention", heads=2, causal=false}, {type="linear", out=256}]' \
  >encoder.log 2>&1 || { cat encoder.log >&2; fail "train an encoder"; }
expect_error not-causal "layer 'attention1' \(attention\) lets each position see later ones" 1 generate encoder \
  --prompt a --max-new-tokens 3
expect_error empty-prompt "the prompt is empty" 1 generate run --prompt "" --max-new-tokens 3
expect_error id-out-of-range "id 256 is outside the model's vocabulary \[0, 256\)" 1 generate run --prompt-ids 3,256 \
  --max-new-tokens 3
expect_error bad-id "'x' is not a token id" 1 generate run --prompt-ids 3,x --max-new-tokens 3
expect_error negative-temperature "--temperature -0.5 is not a number >= 0" 1 generate run --prompt a \
  --max-new-tokens 3 --temperature -0.5
expect_error top-k-zero "--top-k 0 is outside \[1, 256\]" 1 generate run --prompt a --max-new-tokens 3 --top-k 0
expect_error top-k-large "--top-k 257 is outside \[1, 256\]" 1 generate run --prompt a --max-new-tokens 3 --top-k 257
expect_error no-prompt "needs a checkpoint, --prompt TEXT or --prompt-ids LIST" 1 generate run --max-new-tokens 3
expect_error existing-output "'greedy.h5' exists; hpctrain does not overwrite results" 1 generate run --prompt a \
  --max-new-tokens 3 --output greedy.h5
expect_error two-ranks "decodes one sequence on one rank, but 2 ranks were started" 2 generate run --prompt a \
  --max-new-tokens 3
generate run --prompt a --max-new-tokens 3 --output greedy.h5 --force >/dev/null &&
  "$PYTHON" -c 'import h5py; f = h5py.File("greedy.h5"); assert len(f["/generated"]) == 3' &&
  [[ ! -e greedy.h5.partial ]] && pass "--force replaces the output" || fail "--force"
finish
