#!/usr/bin/env bash
# predict and evaluate: predictions of a trained checkpoint reproduce the final /eval metrics of its training run, agree
# on 1, 2 and 4 ranks (to fp32 rounding) and are in sample order; evaluate prints and writes the same metrics; both
# apply the deck's feature transforms (data.log1p, scale, shift) to raw data; regression runs get MAE/MSE/R^2 and
# 10-class runs top-5 accuracy; a run directory or checkpoints/latest names the newest checkpoint; --device (and the
# deck's run.device) choose the backend as train does; a dataset of the wrong shape is refused.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 3000 1
make_spirals validation.h5 777 2
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 64
[model]
layers = [ { type = "linear", out = 32 }, { type = "relu" }, { type = "dropout", p = 0.1 }, { type = "linear", out = 3 } ]
[optimizer]
lr = 0.01
[train]
steps = 150
log_every = 50
TOML
run_ranks 2 train deck.toml --output run >run.log 2>&1 || { cat run.log >&2; fail "training"; }
checkpoint=run/checkpoints/step-00000150.h5
for ranks in 1 2 4; do
  run_ranks $ranks predict $checkpoint --data validation.h5 --output predictions-$ranks.h5 >predict-$ranks.log 2>&1 ||
    { cat predict-$ranks.log >&2; fail "predict on $ranks ranks"; }
done
run_ranks 2 evaluate $checkpoint --data validation.h5 --output evaluation.h5 >evaluate.log 2>&1 ||
  { cat evaluate.log >&2; fail "evaluate"; }
cat evaluate.log
$PYTHON - <<'PY' && pass "predictions reproduce the run's final evaluation, agree on 1/2/4 ranks" || fail "predictions"
import h5py, numpy as np
labels = h5py.File("validation.h5", "r")["/labels"][()]
runs = [h5py.File(f"predictions-{r}.h5", "r") for r in (1, 2, 4)]
# Each rank count puts a sample at another row of its forward call; oneDNN's AVX2 kernels round the last rows of a call
# (a tail of their row block) in another order, so outputs agree to fp32 rounding there and bit for bit elsewhere.
for other in runs[1:]:
    assert np.array_equal(runs[0]["indices"][()], other["indices"][()])
    for name in ("predictions", "probabilities"):
        a, b = runs[0][name][()].astype(np.float64), other[name][()].astype(np.float64)
        assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)), name
        assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(a), (name, np.linalg.norm(a - b) / np.linalg.norm(a))
    top2 = np.sort(runs[0]["predictions"][()], axis=1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] > 1e-4  # no near-tie between the two largest logits
    assert np.array_equal(runs[0]["classes"][()][decided], other["classes"][()][decided]), "classes"
p = runs[0]
assert np.array_equal(p["indices"][()], np.arange(len(labels)))
assert p["predictions"].shape == (len(labels), 3)
accuracy = np.mean(p["classes"][()] == labels)
loss = -np.mean(np.log(p["probabilities"][()][np.arange(len(labels)), labels].astype(np.float64)))
metrics = h5py.File("run/metrics.h5", "r")
print(f"accuracy {accuracy:.4f} vs {metrics['/eval/accuracy'][-1]:.4f}; loss {loss:.6f} vs {metrics['/eval/loss'][-1]:.6f}")
assert accuracy == metrics["/eval/accuracy"][-1]
assert abs(loss - metrics["/eval/loss"][-1]) < 1e-5 * metrics["/eval/loss"][-1]
evaluation = h5py.File("evaluation.h5", "r")
assert evaluation["/eval/accuracy"][0] == metrics["/eval/accuracy"][-1]
assert abs(evaluation["/eval/loss"][0] - metrics["/eval/loss"][-1]) < 1e-9
PY

# The deck's transforms: raw uint8 features (as images come) that data.log1p, data.scale and data.shift map back to
# the spirals' range. predict must read them as training and evaluate do.
$PYTHON - <<'PY'
import h5py, numpy as np
for name in ("train", "validation"):
    with h5py.File(f"{name}.h5", "r") as source, h5py.File(f"{name}-raw.h5", "w") as raw:
        x = source["/features"][()].astype(np.float64)
        # log1p(raw) * 2 - 9 ~ x: raw = expm1((x + 9) / 2), 24..220 for x in [-1.2, 1.2]
        raw["/features"] = np.rint(np.expm1((np.clip(x, -1.3, 1.3) + 9) / 2)).astype(np.uint8)
        raw["/labels"] = source["/labels"][()]
PY
run_ranks 2 train deck.toml --output raw --set data.train=train-raw.h5 --set data.validation=validation-raw.h5 \
  --set data.log1p=true --set data.scale=2.0 --set data.shift=-9.0 >raw.log 2>&1 || { cat raw.log >&2; fail "raw run"; }
run_ranks 2 predict raw/checkpoints/step-00000150.h5 --data validation-raw.h5 --output raw-predictions.h5 \
  >raw-predict.log 2>&1 || { cat raw-predict.log >&2; fail "predict on raw data"; }
run_ranks 2 evaluate raw/checkpoints/step-00000150.h5 --data validation-raw.h5 --output raw-evaluation.h5 \
  >raw-evaluate.log 2>&1 || { cat raw-evaluate.log >&2; fail "evaluate on raw data"; }
reproduced="predict applies log1p, scale and shift: it reproduces evaluate's accuracy and loss"
$PYTHON - <<'PY' && pass "$reproduced" || fail "predict on transformed data differs from evaluate"
import h5py, numpy as np
labels = h5py.File("validation-raw.h5", "r")["/labels"][()]
p = h5py.File("raw-predictions.h5", "r")
accuracy = np.mean(p["classes"][()] == labels)
loss = -np.mean(np.log(p["probabilities"][()][np.arange(len(labels)), labels].astype(np.float64)))
evaluation = h5py.File("raw-evaluation.h5", "r")
print(f"predict: accuracy {accuracy:.4f}, loss {loss:.6f}; evaluate: accuracy {evaluation['/eval/accuracy'][0]:.4f}, "
      f"loss {evaluation['/eval/loss'][0]:.6f}")
assert evaluation["/eval/accuracy"][0] > 0.5, "the model did not learn: the check would prove nothing"
assert accuracy == evaluation["/eval/accuracy"][0]
assert abs(loss - evaluation["/eval/loss"][0]) < 1e-5 * evaluation["/eval/loss"][0]
PY

# The checkpoint named by its run directory or by checkpoints/latest: the newest checkpoint of the run.
for named in run run/checkpoints/latest; do
  run_ranks 2 evaluate $named --data validation.h5 >named.log 2>&1 && grep -q "^$checkpoint on validation.h5" named.log &&
    pass "evaluate $named: $(cat named.log)" || { cat named.log >&2; fail "evaluate $named"; }
done
run_ranks 2 predict run/checkpoints/latest --data validation.h5 --output named-predictions.h5 >named.log 2>&1 &&
  $PYTHON -c "import h5py, numpy as np; a, b = (h5py.File(f, 'r') for f in ('named-predictions.h5', 'predictions-2.h5'));
assert a.attrs['checkpoint'] == '$checkpoint' and np.array_equal(a['predictions'][()], b['predictions'][()])" &&
  pass "predict run/checkpoints/latest reads $checkpoint" || { cat named.log >&2; fail "predict run/checkpoints/latest"; }

# run.device (issue 15, item 16): predict and evaluate choose their backend as train does, --device overriding the
# deck. A deck saying cuda with --device cpu, and --device auto on a node without a GPU, give today's CPU results bit
# for bit; --device cuda without a GPU stops every rank with one message.
same_outputs() {  # same_outputs PREDICTIONS EVALUATION: equal to the 2-rank CPU files above
  $PYTHON -c "import h5py, numpy as np, sys
a, b = h5py.File('$1', 'r'), h5py.File('predictions-2.h5', 'r')
for name in ('predictions', 'probabilities', 'classes', 'indices'):
    assert np.array_equal(a[name][()], b[name][()]), name
e, f = h5py.File('$2', 'r'), h5py.File('evaluation.h5', 'r')
for name in f['eval']:
    assert np.array_equal(e['eval'][name][()], f['eval'][name][()]), name"
}
device_run() {  # device_run NAME ARGS...: predict and evaluate with ARGS on 2 ranks, into NAME-predictions/evaluation.h5
  local name=$1; shift
  run_ranks 2 predict $checkpoint --data validation.h5 --output "$name-predictions.h5" "$@" >"$name.log" 2>&1 &&
    run_ranks 2 evaluate $checkpoint --data validation.h5 --output "$name-evaluation.h5" "$@" >>"$name.log" 2>&1 ||
    { cat "$name.log" >&2; fail "$name: predict/evaluate $*"; }
}
device_run deck-cuda-cli-cpu --set run.device=cuda --device cpu
same_outputs deck-cuda-cli-cpu-predictions.h5 deck-cuda-cli-cpu-evaluation.h5 &&
  pass "a deck saying cuda with --device cpu: predictions and evaluation identical to the CPU's" ||
  fail "--device cpu changed the results"
if run_ranks 2 predict $checkpoint --data validation.h5 --output gpu-predictions.h5 --device cuda >gpu.log 2>&1; then
  pass "--device cuda ran (this machine has a GPU; gpu-check.sh compares it with the CPU)"
else
  for command in predict evaluate; do
    expect_error "$command-device-cuda" "no rank sees a CUDA device|this build has no CUDA backend|CUDA backend cannot be loaded" \
      2 $command $checkpoint --data validation.h5 --output "no-gpu-$command.h5" --device cuda
    [[ ! -e "no-gpu-$command.h5" ]] || fail "$command --device cuda without a GPU wrote its output"
  done
  device_run auto --device auto
  same_outputs auto-predictions.h5 auto-evaluation.h5 && grep -q '^run.device = "auto": on the CPU (' auto.log &&
    pass "--device auto without a GPU: on the CPU, results identical, said once per command" ||
    { cat auto.log >&2; fail "--device auto"; }
fi
expect_error device-word "--device gpu is not one of cpu, cuda, auto" 2 predict $checkpoint --data validation.h5 \
  --output never.h5 --device gpu

# wrong sample shape
"$HPCTRAIN" data generate blobs --samples 100 --features 5 --classes 3 --output wide.h5 >/dev/null
expect_error predict_shape "samples have 5 features, but the model in .* takes 2" 2 predict $checkpoint --data wide.h5 \
  --output wide-predictions.h5
expect_error evaluate_shape "samples have 5 features, but the model in .* takes 2" 2 evaluate $checkpoint --data wide.h5
expect_error predict_no_overwrite "exists; hpctrain does not overwrite" 2 predict $checkpoint --data validation.h5 \
  --output predictions-1.h5

# regression metrics and top-5
"$HPCTRAIN" data generate regression --samples 2000 --features 4 --outputs 2 --seed 1 --output reg.h5 >/dev/null
"$HPCTRAIN" data generate regression --samples 400 --features 4 --outputs 2 --seed 2 --output reg-val.h5 >/dev/null
run_ranks 2 train deck.toml --output reg --set model.loss=mse --set data.train=reg.h5 --set data.validation=reg-val.h5 \
  --set 'model.layers[3].out=2' >reg.log 2>&1 || { cat reg.log >&2; fail "regression run"; }
# overlapping blobs (noise 6): the 10-class model misses some, so its accuracy and top-5 differ
"$HPCTRAIN" data generate blobs --samples 2000 --features 8 --classes 10 --seed 1 --noise 6 --output ten.h5 >/dev/null
run_ranks 2 train deck.toml --output ten --set data.train=ten.h5 --set data.validation=ten.h5 \
  --set 'model.layers[3].out=10' >ten.log 2>&1 || { cat ten.log >&2; fail "10-class run"; }
$PYTHON - <<'PY' && pass "regression MAE/MSE/R^2 and top-5 accuracy recorded" || fail "metrics"
import h5py, numpy as np
reg = h5py.File("reg/metrics.h5", "r")
assert np.isclose(reg["/eval/mse"][-1], reg["/eval/loss"][-1], rtol=1e-9)
assert 0 < reg["/eval/mae"][-1] and reg["/eval/r2"][-1] <= 1, reg["/eval/r2"][-1]
ten = h5py.File("ten/metrics.h5", "r")
assert ten["/eval/top5_accuracy"][-1] >= ten["/eval/accuracy"][-1]
print("r2", reg["/eval/r2"][-1], "top5", ten["/eval/top5_accuracy"][-1], "top1", ten["/eval/accuracy"][-1])
PY
# Training's validation counts its hits on the backend (issue 16): the same accuracies as the host rule on the model's
# fp32 outputs that predict writes (argmax: the first maximum; top-5: fewer than 5 outputs strictly larger).
run_ranks 2 predict ten --data ten.h5 --output ten-predictions.h5 >ten-predict.log 2>&1 ||
  { cat ten-predict.log >&2; fail "10-class predict"; }
$PYTHON - <<'PY' && pass "validation accuracy and top-5 equal the host rule on predict's outputs" || fail "hits"
import h5py, numpy as np
outputs = h5py.File("ten-predictions.h5", "r")["predictions"][()]
labels = h5py.File("ten.h5", "r")["/labels"][()]
ten = h5py.File("ten/metrics.h5", "r")
target = outputs[np.arange(len(labels)), labels][:, None]
accuracy = np.mean(np.argmax(outputs, axis=1) == labels)
top5 = np.mean(np.sum(outputs > target, axis=1) < 5)
print(f"accuracy {accuracy} vs {ten['/eval/accuracy'][-1]}, top-5 {top5} vs {ten['/eval/top5_accuracy'][-1]}")
assert 0 < accuracy < top5 < 1, "the check needs hits and misses of both kinds"
assert accuracy == ten["/eval/accuracy"][-1] and top5 == ten["/eval/top5_accuracy"][-1]
PY
finish
