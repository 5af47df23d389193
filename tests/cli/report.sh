#!/usr/bin/env bash
# tools/hpctrain_report.py on a real run's output: the summary names the steps, the final loss and the evaluation, and
# the plot is a PNG of sensible size. A directory without metrics.h5 is refused.
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
