#!/usr/bin/env bash
# inputs/gpt2-124m.toml (GPT-2 small, for GPU nodes) on the CPU, shortened through --set only: 2 steps of 2 windows of
# random ids at a context of 32. The model is the deck's, so its parameter count is GPT-2's at that context (computed
# here from the widths), and the first loss is near ln(50304), GPT-2's initialisation giving nearly uniform logits
# (checked against ln(50304) + 768 x 0.02^2 / 2, the mean loss of logits of that variance).
# Then the whole deck's dry run on 8 ranks: 124,475,904 parameters at its context of 1024, and the memory per rank its
# header quotes.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
cp "$HPCTRAIN_SOURCE_DIR"/inputs/gpt2-124m.toml .
mkdir data
# Random ids over the whole vocabulary: 6 windows of 32 for the smoke run; 512 windows of 1024 (one global batch of
# the deck) plus a validation file for the dry run.
$PYTHON - <<'PY' || fail "making the ids"
import numpy as np
rng = np.random.default_rng(1)
np.save("short.npy", rng.integers(0, 50304, 6 * 32 + 1).astype(np.uint16))
np.save("long.npy", rng.integers(0, 50304, 520 * 1024 + 1).astype(np.uint16))
PY
"$HPCTRAIN" data convert --tokens short.npy --vocabulary 50304 --sequence-length 32 --output data/short.h5 >/dev/null ||
  fail "convert --tokens (short)"
"$HPCTRAIN" data convert --tokens long.npy --vocabulary 50304 --validation-fraction 0.01 --sequence-length 1024 \
  --output data/gpt2-train.h5 --validation-output data/gpt2-validation.h5 >/dev/null || fail "convert --tokens (long)"

smoke=(--set run.device=cpu --set data.train=data/short.h5 --set 'data.validation=""' --set data.sequence_length=32
  --set data.batch_size=2 --set train.accumulate=1 --set train.steps=2 --set train.log_every=1
  --set checkpoint.at_end=false --set checkpoint.every_steps=0 --set checkpoint.every_seconds=false)
run_ranks 1 train gpt2-124m.toml --output smoke "${smoke[@]}" >smoke.log 2>&1 || { cat smoke.log >&2; fail "2 steps"; }
grep -E "total parameters|step +[12]\b" smoke.log || true
[[ ! -d smoke/checkpoints ]] || [[ -z $(ls smoke/checkpoints) ]] || fail "the smoke run wrote a checkpoint"
$PYTHON - <<'PY' && pass "GPT-2 124M on the CPU: the parameter count at T = 32, a first loss near ln(50304)" || fail "GPT-2 smoke run"
import math, re, h5py, numpy as np
def gpt2_parameters(vocabulary, context, width=768, layers=12):
    block = 2 * 2 * width + (width * 3 * width + 3 * width) + (width * width + width) \
        + (width * 4 * width + 4 * width) + (4 * width * width + width)  # ln_1, ln_2, c_attn, attn.c_proj, c_fc, c_proj
    return vocabulary * width + context * width + layers * block + 2 * width  # wte, wpe, blocks, ln_f; head tied
assert gpt2_parameters(50257, 1024) == 124439808  # GPT-2 small as published
text = open("smoke.log").read()
found = re.search(r"total parameters: (\d+)", text)
assert found and int(found.group(1)) == gpt2_parameters(50304, 32), (found and found.group(1), gpt2_parameters(50304, 32))
loss = h5py.File("smoke/metrics.h5", "r")["/train/loss"][()]
print(f"parameters {found.group(1)}; losses {loss}, ln(50304) = {math.log(50304):.4f}")
assert len(loss) == 2 and np.all(np.isfinite(loss)), loss
# GPT-2's init gives logits of variance 768 x 0.02^2 (a unit-variance layernorm output against the tied table):
# a first loss of about ln(V) + 0.15, give or take 0.1 over 64 positions (PyTorch's N(0, 1) table would give ~30)
expected = math.log(50304) + 768 * 0.02**2 / 2
print(f"first loss {loss[0]:.4f}, expected about {expected:.4f}")
assert abs(loss[0] - expected) < 0.3, loss[0]
PY

run_ranks 8 train gpt2-124m.toml --output full --dry-run >dry.log 2>&1 || { cat dry.log >&2; fail "dry run"; }
grep -E "^batches|  total  |activations \(" dry.log || true
grep -q "total parameters: 124475904" dry.log && pass "the whole deck: 124,475,904 parameters" ||
  { cat dry.log >&2; fail "the whole deck's parameter count"; }
# The memory the deck's header quotes for 8 ranks (16 windows per micro-batch).
grep -qE "^  total +11.4 GiB" dry.log && pass "the whole deck on 8 ranks: 11.4 GiB per rank, as its header says" ||
  fail "the dry run's memory estimate differs from the deck's header"
finish
