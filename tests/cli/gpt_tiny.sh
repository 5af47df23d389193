#!/usr/bin/env bash
# The small GPT deck (inputs/gpt-tiny.toml: embedding -> dropout -> 2 transformer_blocks -> layernorm -> linear on
# GPL-3), shortened: 1 and 2 ranks give the same losses; a bf16 run interrupted and resumed on 2 ranks ends with the
# same checkpoint, bit for bit, as an uninterrupted one; the checkpoint names the blocks' tensors as GPT-2 does. The
# full deck's figure (validation loss against the byte-unigram entropy) is in docs/data.md, not measured here.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_gpl3_tokens
cp "$HPCTRAIN_SOURCE_DIR"/inputs/gpt-tiny.toml .

# 1. rank invariance (dropout included: its masks are keyed by sample, not rank)
short=(--set train.steps=20 --set train.log_every=1 --set train.eval_every=10)
for ranks in 1 2; do
  run_ranks $ranks train gpt-tiny.toml --output ranks-$ranks "${short[@]}" >ranks-$ranks.log 2>&1 ||
    { cat ranks-$ranks.log >&2; fail "gpt-tiny on $ranks ranks"; }
done
grep -q "transformer_block2.c_fc" ranks-1.log && pass "summary names the blocks' layers" ||
  { cat ranks-1.log >&2; fail "summary without the blocks' layers"; }
$PYTHON - <<'PY' && pass "gpt-tiny: 1 and 2 ranks give the same losses; GPT-2's names" || fail "gpt-tiny: rank invariance"
import h5py, numpy as np
runs = {r: h5py.File(f"ranks-{r}/metrics.h5", "r") for r in (1, 2)}
for key in ("/train/loss", "/eval/loss"):
    a, b = runs[1][key][:], runs[2][key][:]
    assert len(a) == len(b) > 0 and np.all(np.isfinite(a)), (key, a, b)
    rel = np.abs(a - b).max() / np.abs(a).max()
    print(f"{key}: {len(a)} values, largest relative difference {rel:.2e}")
    assert rel <= 1e-5, (key, rel)
with h5py.File("ranks-2/checkpoints/step-00000020.h5", "r") as f:
    names = []
    f["/model"].visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
for name in ("transformer_block2.ln_1/weight", "transformer_block2.attn/c_attn.weight", "transformer_block2.ln_2/bias",
             "transformer_block2.c_fc/weight", "transformer_block2.c_proj/weight"):
    assert name in names, (name, sorted(names))
PY

# 2. exact resume, bf16 on 2 ranks: 10 steps, then resumed to 20, against 20 in one go
common=(--set train.log_every=5 --set train.eval_every=0 --set 'data.validation=""' --set precision.mode=bf16)
run_ranks 2 train gpt-tiny.toml --output resume-full "${common[@]}" --set train.steps=20 >/dev/null 2>&1 ||
  fail "resume: full run"
run_ranks 2 train gpt-tiny.toml --output resume-part "${common[@]}" --set train.steps=10 >/dev/null 2>&1 ||
  fail "resume: first half"
run_ranks 2 train gpt-tiny.toml --output resume-part "${common[@]}" --set train.steps=20 --resume auto >resume.log 2>&1 ||
  { cat resume.log >&2; fail "resume: second half"; }
$PYTHON "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/same_datasets.py" resume-full/checkpoints/step-00000020.h5 \
  resume-part/checkpoints/step-00000020.h5 &&
  pass "gpt-tiny bf16: exact resume" || fail "gpt-tiny: resumed state differs"
finish
