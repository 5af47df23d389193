#!/usr/bin/env bash
# Every command in README.md and docs/*.md that a reader can copy runs here, in a scratch copy of the repository
# layout, and must succeed:
# - ```bash/```sh blocks and the `$ ` lines of unlabelled blocks (tests/cli/lib/doc_commands.py extracts them), run
#   block by block with `set -e`, `hpctrain` and `mpiexec` on PATH; a deck.toml and data/ are made first.
#   `jobscripts/local.sh` lines run as a reader who built but did not install hpctrain: not on PATH, HPCTRAIN unset.
# - ```python blocks, with Debian's python3 (h5py); one that imports torch runs only where torch is installed.
# - inline `hpctrain COMMAND ...` synopses: `hpctrain COMMAND --help` must succeed (the command exists).
# Commands that need what a test cannot have run elsewhere, and this test checks that they still do:
#   tools/test.sh, tools/quickstart.sh, git clone   -> .ci/run (a fresh clone runs README commands 1 and 2)
#   sbatch, srun, scontrol requeue                   -> cli.slurm (a real Slurm runs jobscripts/slurm.sbatch)
#   cmake --build --preset debug|cpu-only            -> configured here (cmake --preset, into a scratch directory);
#                                                      built only by hand (a second full build is minutes of CI)
# qsub, bsub and flux run through stand-ins that start the job script the way the scheduler would, in dry-run mode
# (HPCTRAIN_DRY_RUN=1: the launch line is printed), so the documented submit syntax reaches the script intact.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
"$PYTHON" "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/doc_commands.py" "$HPCTRAIN_SOURCE_DIR" blocks

# ---- the scratch repository: sources linked, build/release/bin/hpctrain the binary under test ----
mkdir -p repo/build/release/bin repo/data bin hpctrain-bin
for entry in inputs tools jobscripts bench CMakePresets.json; do ln -s "$HPCTRAIN_SOURCE_DIR/$entry" repo/$entry; done
ln -s "$HPCTRAIN" repo/build/release/bin/hpctrain
ln -s "$HPCTRAIN" hpctrain-bin/hpctrain
printf '#!/usr/bin/env bash\nexec %s "$@"\n' "$MPIEXEC" >bin/mpiexec
# Scheduler stand-ins: run the job script as the scheduler would start it, dry-run.
cat >bin/qsub <<'SH'
#!/usr/bin/env bash
variables=()
while [[ $1 == -* ]]; do [[ $1 == -v ]] && IFS=, read -r -a variables <<<"$2"; shift 2; done
hostname >"$TMPDIR/pbs-nodefile"
exec env "${variables[@]}" PBS_NODEFILE="$TMPDIR/pbs-nodefile" HPCTRAIN_WALLTIME=01:00:00 HPCTRAIN_DRY_RUN=1 bash "$@"
SH
cat >bin/bsub <<'SH'
#!/usr/bin/env bash
variables=()
while [[ $1 == -* ]]; do
  if [[ $1 == -env ]]; then
    IFS=, read -r -a listed <<<"${2#all}"
    for variable in "${listed[@]// /}"; do [[ -n $variable ]] && variables+=("$variable"); done
  fi
  shift 2
done
exec env "${variables[@]}" HPCTRAIN_NODES=1 HPCTRAIN_DRY_RUN=1 bash -s
SH
printf '#!/usr/bin/env bash\n[[ $1 == batch ]] && shift\nexec env HPCTRAIN_NODES=1 HPCTRAIN_DRY_RUN=1 bash "$@"\n' >bin/flux
chmod +x bin/*
# jobscripts/local.sh runs as a reader who built hpctrain but did not install it: not on PATH, HPCTRAIN unset.
without_hpctrain=$WORK/bin:$PATH
PATH=$without_hpctrain command -v hpctrain >/dev/null && fail "an hpctrain outside this test is on PATH: $(command -v hpctrain)"
export PATH=$WORK/hpctrain-bin:$without_hpctrain TMPDIR=$WORK HPCTRAIN_PYTHON=$PYTHON

# The data and deck the examples refer to.
cd repo
make_spirals data/spirals-train.h5 2400 1
make_spirals data/spirals-validation.h5 480 2
cat >deck.toml <<'TOML'
[data]
train = "data/spirals-train.h5"
validation = "data/spirals-validation.h5"
batch_size = 48
[model]
layers = [ { type = "linear", out = 32 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 40
[checkpoint]
at_end = true
TOML
have_torch=0
"$PYTHON" -c "import torch" 2>/dev/null && have_torch=1
if ((have_torch)); then  # docs/file-formats.md loads the default deck's final checkpoint into PyTorch
  run_ranks 2 train inputs/default.toml --output runs/default >default.log 2>&1 || { cat default.log >&2; fail "runs/default"; }
fi

# ---- the blocks, in document order ----
covered() {  # covered PATTERN FILE WHAT: the command is run elsewhere; check that place still runs it
  grep -qE -- "$1" "$HPCTRAIN_SOURCE_DIR/$2" && echo "  (run by $3)" || fail "$3 no longer runs '$1' ($2)"
}
for block in ../blocks/*.sh ../blocks/*.py; do
  origin=$(head -1 "$block" | cut -c3-)
  if [[ $block == *.py ]]; then
    if grep -q "import.*torch" "$block" && ((have_torch == 0)); then
      echo "not run: $origin (python: needs torch, not installed here)"
      continue
    fi
    "$PYTHON" "$block" >"$block.log" 2>&1 && pass "$origin (python)" || { cat "$block.log" >&2; fail "$origin (python)"; }
    continue
  fi
  script=$block.run
  echo "set -euo pipefail" >"$script"
  while IFS= read -r command; do
    case $command in
      \#*) continue ;;
      tools/test.sh* | tools/quickstart.sh*)
        covered "^${command%% *}" .ci/run ".ci/run" ;;
      "git clone "*) covered "^tools/test.sh" .ci/run ".ci/run, on a fresh clone" ;;
      sbatch*) covered "sbatch " tests/cli/slurm.sh "cli.slurm" ;;
      srun*) covered "srun" jobscripts/slurm.sbatch "jobscripts/slurm.sbatch, which cli.slurm submits" ;;
      *"scontrol requeue"*)
        covered "scontrol requeue" jobscripts/slurm.sbatch "jobscripts/slurm.sbatch, which cli.slurm submits" ;;
      "cmake --preset release && cmake --build --preset release"*)
        covered "cmake --build --preset release" tools/test.sh "tools/test.sh" ;;
      "cmake --preset "*)
        preset=$(awk '{print $3}' <<<"$command")
        echo "cmake -S '$HPCTRAIN_SOURCE_DIR' --preset $preset -B '$WORK/configure-$preset' >'$WORK/configure-$preset.log'" >>"$script"
        echo "  (cmake --preset $preset: configured here; its build is not run)" ;;
      *jobscripts/local.sh*) echo "(unset HPCTRAIN; PATH='$without_hpctrain'; ${command%%#*})" >>"$script" ;;
      *) echo "$command" >>"$script" ;;
    esac
  done < <(tail -n +2 "$block")
  if (($(wc -l <"$script") > 1)); then
    timeout 240 bash "$script" >"$block.log" 2>&1 && pass "$origin: $(($(wc -l <"$script") - 1)) command(s)" ||
      { cat "$script" "$block.log" >&2; fail "$origin"; }
  fi
done
grep -q "launch: mpiexec -n 1 .* train deck.toml --resume auto" ../blocks/*.log &&
  grep -q "launch: jsrun .* train deck.toml --resume auto" ../blocks/*.log &&
  grep -q "launch: flux run .* train deck.toml --resume auto" ../blocks/*.log &&
  pass "qsub, bsub and flux submissions reach their job scripts with the deck" || fail "a submit line lost the deck"

# ---- inline synopses name real commands ----
while read -r origin first second _; do
  words=("$first")
  [[ $first == data || $first == checkpoint ]] && words+=("$second")
  "$HPCTRAIN" "${words[@]}" --help >/dev/null 2>&1 || fail "$origin: 'hpctrain ${words[*]}' is not a command"
done <../blocks/synopses
pass "$(wc -l <../blocks/synopses) inline 'hpctrain ...' mentions name commands that exist"
finish
