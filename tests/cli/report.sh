#!/usr/bin/env bash
# tools/hpctrain_report.py on a real run's output: the summary names the steps, the final loss and the evaluation, and
# the plot is a PNG of sensible size; --help and errors say `hpctrain report`; --csv matches metrics.h5; --verbose
# shows what the plot holds (title, y labels, panels), for one run and for two in one plot. A directory without
# metrics.h5 is refused.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2000 1
make_spirals validation.h5 400 2
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 120
eval_every = 40
[precision]
mode = "fp16"
TOML
run_ranks 2 train deck.toml --output run >run.log 2>&1 || { cat run.log >&2; fail "training run"; }
report="$HPCTRAIN_SOURCE_DIR/tools/hpctrain_report.py"
$PYTHON "$report" run --plot curves.png >report.txt 2>&1 || { cat report.txt >&2; fail "report failed"; }
cat report.txt
grep -q "^steps: 120; final training loss" report.txt && grep -q "evaluation at step 120: accuracy" report.txt &&
  grep -q "checkpoints: step-00000120.h5" report.txt && pass "summary" || fail "summary incomplete"
$PYTHON - <<'PY' && pass "curves.png is a PNG of sensible size" || fail "plot"
import struct
data = open("curves.png", "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
width, height = struct.unpack(">II", data[16:24])
assert width >= 800 and height >= 500 and len(data) > 20000, (width, height, len(data))
PY
# --help and errors name the command as users type it, never the script.
"$HPCTRAIN" report --help >help.txt 2>&1 || { cat help.txt >&2; fail "hpctrain report --help failed"; }
grep -qF "usage: hpctrain report RUN_DIR... [--plot OUT.png] [--csv [FILE]]" help.txt && ! grep -q "hpctrain_report" help.txt &&
  pass "hpctrain report --help: $(head -1 help.txt)" || { cat help.txt >&2; fail "--help does not name 'hpctrain report'"; }
status=0
"$HPCTRAIN" report run --no-such-option >bad-option.txt 2>&1 || status=$?
((status == 2)) && grep -q "^hpctrain report: error: .*--no-such-option" bad-option.txt && ! grep -q "hpctrain_report" bad-option.txt &&
  pass "an unknown option: exit 2, $(grep error: bad-option.txt)" || { cat bad-option.txt >&2; fail "unknown option (status $status)"; }

# --csv: the /train table with /eval joined by step, only CSV on standard output; values as in metrics.h5.
"$HPCTRAIN" report run --csv >run.csv 2>csv-stderr.txt || { cat csv-stderr.txt >&2; fail "--csv failed"; }
"$HPCTRAIN" report run --csv run-file.csv >csv-file.txt 2>&1 && cmp -s run.csv run-file.csv &&
  grep -q "^csv: run-file.csv" csv-file.txt && pass "--csv FILE writes what --csv prints" || fail "--csv FILE differs from --csv"
$PYTHON - <<'PY' && pass "--csv: header, 120 rows (one per step), values equal metrics.h5" || fail "--csv output"
import csv, h5py
header = open("run.csv").readline().strip().split(",")
assert header == ["run", "step", "loss", "lr", "samples_per_sec", "grad_norm", "loss_scale", "skipped", "eval_loss",
                  "eval_accuracy"], header
rows = list(csv.DictReader(open("run.csv")))
with h5py.File("run/metrics.h5", "r") as f:
    train, evaluation = {k: f["train"][k][()] for k in f["train"]}, {k: f["eval"][k][()] for k in f["eval"]}
assert len(rows) == len(train["step"]) == 120, len(rows)
assert {row["run"] for row in rows} == {"run"}
for i, row in enumerate(rows):
    assert int(row["step"]) == train["step"][i]
    for name in ("loss", "lr", "samples_per_sec", "grad_norm", "loss_scale"):
        assert float(row[name]) == train[name][i], (name, i, row[name], train[name][i])  # exact: repr round-trips
    assert int(row["skipped"]) == train["skipped"][i]
evaluated = {int(step): j for j, step in enumerate(evaluation["step"])}
assert sorted(evaluated) == [40, 80, 120], evaluated
for row in rows:
    j = evaluated.get(int(row["step"]))
    for name in ("loss", "accuracy"):
        assert (row["eval_" + name] == "") if j is None else float(row["eval_" + name]) == evaluation[name][j], row
PY

# --verbose: what the plot shows, read back from matplotlib: the run's name as title, a y label on every panel, the
# smoothed loss beside the raw one, gradient-norm and throughput panels, evaluation metrics apart from the losses.
"$HPCTRAIN" report run --plot single.png --verbose >single.txt 2>&1 || { cat single.txt >&2; fail "--verbose"; }
cat single.txt
grep -qx "  title: run" single.txt && pass "the plot's title is the run's name" || fail "plot title"
panels=$(grep -c "^  panel " single.txt || true)
((panels >= 6)) && ! grep "^  panel " single.txt | grep -q "y label ''" &&
  pass "$panels panels, each with a y label" || fail "a panel without a y label (or fewer than 6 panels)"
for panel in "training loss" "evaluation metrics" "learning rate" "loss scale" "gradient norm" "throughput"; do
  grep -q "^  panel $panel: x label 'step', y label '[^']" single.txt || fail "no '$panel' panel with axis labels"
done
grep "^  panel training loss:" single.txt | grep -q "run: training loss (raw); run: training loss (EMA over [0-9]* steps)" &&
  pass "raw and smoothed training loss, the smoothing window in the legend" || fail "no smoothed training loss"
grep "^  panel evaluation metrics:" single.txt | grep -q "lines: run: accuracy$" &&
  pass "accuracy on its own axis, apart from the losses" || fail "evaluation metrics panel"

# Several runs in one plot (and one CSV): one colour per run, a legend naming them, both in the title.
run_ranks 1 train deck.toml --set optimizer.lr=0.01 --set train.steps=80 --output run-b >run-b.log 2>&1 ||
  { cat run-b.log >&2; fail "second training run"; }
"$HPCTRAIN" report run run-b --plot both.png --verbose --csv both.csv >both.txt 2>&1 || { cat both.txt >&2; fail "two runs"; }
cat both.txt
grep -qx "  title: run, run-b" both.txt && grep -qx "  legend: run, run-b" both.txt &&
  pass "two runs: the title and the legend name both" || fail "two runs: title or legend"
missing=0
for panel in "training loss" "evaluation metrics" "learning rate" "loss scale" "gradient norm" "throughput"; do
  line=$(grep "^  panel $panel:" both.txt || true)
  [[ $line == *"lines: run: "* && $line == *"; run-b: "* ]] || { missing=1; fail "panel '$panel' lacks a run: $line"; }
done
((missing == 0)) && pass "two runs: every panel draws both"
$PYTHON - <<'PY' && pass "two runs: the PNG, and the CSV's run column (120 + 80 rows)" || fail "two runs: PNG or CSV"
import collections, csv
data = open("both.png", "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000, len(data)
counts = collections.Counter(row["run"] for row in csv.DictReader(open("both.csv")))
assert counts == {"run": 120, "run-b": 80}, counts
PY

mkdir empty
$PYTHON "$report" empty >empty.txt 2>&1 && fail "a directory without metrics.h5 was accepted" ||
  { grep -q "metrics.h5 does not exist" empty.txt && pass "refused: $(cat empty.txt)" || fail "unclear refusal"; }

# `hpctrain report` wraps the script: same summary, the script's exit status.
$PYTHON "$report" run >direct.txt 2>&1
"$HPCTRAIN" report run >wrapped.txt 2>&1 && diff direct.txt wrapped.txt >/dev/null &&
  pass "hpctrain report RUN_DIR prints the script's summary" || { cat wrapped.txt >&2; fail "hpctrain report"; }
status=0
"$HPCTRAIN" report empty >/dev/null 2>&1 || status=$?
((status == 2)) && pass "hpctrain report: exit status 2 on an empty directory" ||
  fail "hpctrain report: exit status $status on an empty directory (bad input is 2)"
status=0
HPCTRAIN_REPORT_SCRIPT=missing.py "$HPCTRAIN" report run >missing.txt 2>&1 || status=$?
((status == 2)) && grep -q "HPCTRAIN_REPORT_SCRIPT=missing.py is not a file" missing.txt &&
  pass "a wrong HPCTRAIN_REPORT_SCRIPT is one clear error" || { cat missing.txt >&2; fail "HPCTRAIN_REPORT_SCRIPT"; }

# An installed tree finds its own copy of the script (share/hpctrain/), not the sources'.
cmake --install "$(dirname "$(dirname "$HPCTRAIN")")" --prefix prefix >install.log 2>&1 || { cat install.log >&2; fail "cmake --install"; }
[[ -x prefix/bin/hpctrain && -f prefix/share/hpctrain/inputs/default.toml && -f prefix/share/hpctrain/jobscripts/slurm.sbatch ]] &&
  pass "cmake --install: bin/hpctrain, share/hpctrain/{inputs,jobscripts}" || fail "install tree incomplete"
echo 'print("report: the installed copy")' >>prefix/share/hpctrain/hpctrain_report.py
prefix/bin/hpctrain report run 2>&1 | grep -q "the installed copy" && pass "installed hpctrain report runs share/hpctrain/hpctrain_report.py" ||
  fail "installed hpctrain report did not use its own script"
finish
