#!/usr/bin/env bash
# Token data (issue 16): `data convert --text` (byte-level, with a validation file) and `--tokens X.npy --vocabulary V`
# (the stored type follows the vocabulary; a bad id is named by its position), `data inspect` on a token file (counts,
# windows, unigram entropy against a NumPy reference), and the trainer's refusal of token data for a model that does
# not start with an embedding (cli/language_model.sh trains one).
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
licence=/usr/share/common-licenses/GPL-3
[[ -r $licence ]] || { echo "skipped: $licence is missing"; exit 77; }
head -c 20000 "$licence" >a.txt
printf 'second file\n' >b.txt

# byte-level text: two files concatenated, the last 10% of the bytes in the validation file
"$HPCTRAIN" data convert --text a.txt b.txt --validation-fraction 0.1 --validation-output val.h5 --output train.h5 \
  --sequence-length 32 >convert.log 2>&1 || { cat convert.log >&2; fail "convert --text"; }
$PYTHON - <<'PY' && pass "convert --text: bytes, split, attributes" || fail "convert --text contents"
import h5py, numpy as np
data = open("a.txt", "rb").read() + open("b.txt", "rb").read()
validation = round(0.1 * len(data))
with h5py.File("train.h5") as t, h5py.File("val.h5") as v:
    assert t["/tokens"].dtype == np.uint8 and v["/tokens"].dtype == np.uint8
    assert bytes(t["/tokens"][()]) + bytes(v["/tokens"][()]) == data
    assert len(v["/tokens"]) == validation, (len(v["/tokens"]), validation)
    for f in (t, v):
        assert f.attrs["vocabulary_size"] == 256 and f.attrs["sequence_length"] == 32
        assert f.attrs["tokenizer"] == "bytes"
PY

"$HPCTRAIN" data inspect train.h5 >inspect.log 2>&1 || { cat inspect.log >&2; fail "inspect"; }
$PYTHON - <<'PY' && pass "inspect: tokens, windows, ids used, entropy" || { cat inspect.log >&2; fail "inspect text"; }
import re, h5py, numpy as np
text = open("inspect.log").read()
tokens = h5py.File("train.h5")["/tokens"][()]
counts = np.bincount(tokens, minlength=256)
p = counts[counts > 0] / len(tokens)
entropy = -(p * np.log2(p)).sum()
assert f"tokens (/tokens, uint8): {len(tokens)}, vocabulary 256" in text, text
assert f"windows: {(len(tokens) - 1) // 32} of 33 tokens at T = 32" in text, text
assert f"ids used: {(counts > 0).sum()} of 256" in text, text
assert f"most frequent bytes: ' ' " in text, text
shown = float(re.search(r"unigram entropy: ([0-9.]+) bits", text).group(1))
assert abs(shown - entropy) < 1e-4, (shown, entropy)
PY
# 2001 validation tokens (10% of 20012): 2000 / 7 windows
"$HPCTRAIN" data inspect val.h5 --sequence-length 7 | grep -q "windows: 285 of 8 tokens at T = 7" &&
  pass "inspect --sequence-length" || fail "inspect --sequence-length"

# token ids from a .npy: the stored type follows the vocabulary
$PYTHON -c "
import numpy as np
rng = np.random.default_rng(1)
np.save('small.npy', rng.integers(0, 256, 1000).astype(np.int64))
np.save('medium.npy', rng.integers(0, 50304, (10, 100)).astype(np.int32))
np.save('large.npy', rng.integers(0, 70000, 1000).astype(np.uint32))
bad = rng.integers(0, 1000, (4, 50)); bad[2, 7] = 1000; bad[3, 0] = 5000
np.save('bad.npy', bad)
np.save('float.npy', np.zeros(10, np.float32))
"
for case in "small 256" "medium 50304" "large 70000"; do
  read -r name vocabulary <<<"$case"
  "$HPCTRAIN" data convert --tokens "$name.npy" --vocabulary "$vocabulary" --output "$name.h5" >/dev/null 2>&1 ||
    fail "convert --tokens $name"
done
$PYTHON - <<'PY' && pass "convert --tokens: uint8, uint16, int32 by vocabulary" || fail "convert --tokens contents"
import h5py, numpy as np
for name, vocabulary, dtype in (("small", 256, np.uint8), ("medium", 50304, np.uint16), ("large", 70000, np.int32)):
    f = h5py.File(f"{name}.h5")
    assert f["/tokens"].dtype == dtype, (name, f["/tokens"].dtype)
    assert (f["/tokens"][()] == np.load(f"{name}.npy").ravel()).all(), name
    assert f.attrs["vocabulary_size"] == vocabulary and "sequence_length" not in f.attrs
PY
expect_error bad-id "id 1000 at position 107 .* outside \[0, 1000\)" 1 data convert --tokens bad.npy --vocabulary 1000 \
  --output bad.h5
[[ ! -e bad.h5 && ! -e bad.h5.partial ]] && pass "no file left after a bad id" || fail "bad.h5 left behind"
expect_error float-ids "holds float32 values; token ids are integers" 1 data convert --tokens float.npy \
  --vocabulary 10 --output f.h5

# training a model without an embedding on token data is refused at set-up, on every rank
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "val.h5"
batch_size = 4
[model]
layers = [ { type = "linear", out = 8 } ]
[train]
steps = 1
TOML
expect_error lm-refused "holds token data \(562 windows of 32 tokens, vocabulary 256\), but the model's first layer .* does not take token ids" \
  2 train deck.toml --output run
# the data tools read token windows like training would
run_ranks 2 data bench deck.toml --steps 3 --set 'data.validation=[]' 2>&1 | grep -q "562 samples of 256 bytes (int32 token windows), 2 ranks" &&
  pass "data bench on token windows" || fail "data bench on token data"
expect_error no-length "without a sequence_length attribute, and data.sequence_length is not set" 1 train deck.toml \
  --set 'data.train=["small.h5"]' --set 'data.validation=[]' --output run2
finish
