#!/usr/bin/env bash
# The sharded optimizer update (each rank updates its slice of the parameters, then all-gathers them; the default on
# more than one rank) gives the bits of the replicated one (every rank updates everything): on 2 and 3 ranks, in fp32
# with AdamW, gradient clipping and no decay on biases, in bf16 with SGD and Nesterov momentum (its 16-bit working
# copy gathered too), and with a model of fewer gradient-norm chunks than ranks, every dataset of /model and
# /optimizer in the final checkpoints and every loss and gradient norm in metrics.h5 are identical. A checkpoint
# written in the middle of a sharded run resumes to the same end (on 3 ranks too, sharded as replicated), and one
# whose optimizer state was changed in either rank's part is refused; with the MPI progress thread too. (The variable's bad values: cli/bad_input.sh.)
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2048 5
# 2-512-1024-512-3: about 1.05M parameters in 3 all-reduce buckets (a quarter of the gradients each, at least 1 MiB),
# so every rank owns a slice of each, several chunks of the gradient norm, and writes and reads several ranges of
# the optimizer state; biases between the weights split the decay ranges inside the ranks' slices.
cat >adamw.toml <<'TOML'
[run]
seed = 11
[data]
train = "train.h5"
batch_size = 48
[model]
layers = [
  { type = "linear", out = 512 }, { type = "gelu" }, { type = "linear", out = 1024 }, { type = "tanh" },
  { type = "linear", out = 512 }, { type = "relu" }, { type = "linear", out = 3 },
]
[optimizer]
type = "adamw"
lr = 0.001
weight_decay = 0.05
grad_clip = 0.5
no_decay = ["bias"]
[train]
steps = 12
log_every = 1
[checkpoint]
every_steps = 6
keep = 4
TOML
# 2-192-192-192-3 (75k parameters, one bucket, 19 chunks).
cat >sgd.toml <<'TOML'
[run]
seed = 12
[precision]
mode = "bf16"
[data]
train = "train.h5"
batch_size = 48
[model]
layers = [
  { type = "linear", out = 192 }, { type = "relu" }, { type = "linear", out = 192 }, { type = "relu" },
  { type = "linear", out = 192 }, { type = "relu" }, { type = "linear", out = 3 },
]
[optimizer]
type = "sgd"
lr = 0.05
momentum = 0.9
nesterov = true
weight_decay = 0.01
[train]
steps = 12
log_every = 1
TOML
# 2-16-3: 99 parameters, one chunk, so on 3 ranks two own nothing and still take part in every gather.
cat >tiny.toml <<'TOML'
[run]
seed = 13
[data]
train = "train.h5"
batch_size = 48
[model]
layers = [ { type = "linear", out = 16 }, { type = "tanh" }, { type = "linear", out = 3 } ]
[optimizer]
lr = 0.05
[train]
steps = 12
log_every = 1
TOML

for deck in adamw sgd tiny; do
  for ranks in 2 3; do
    for layout in replicated sharded; do
      name=$deck-$ranks-$layout
      HPCTRAIN_MPI_OPTIMIZER=$layout run_ranks $ranks train $deck.toml --output $name \
        >$name.log 2>&1 || { cat $name.log >&2; fail "$name"; continue; }
    done
    grep -q "each rank updates its slice" $deck-$ranks-sharded.log || fail "$deck on $ranks ranks: the log names no sharded update"
    grep -q "each rank updates its slice" $deck-$ranks-replicated.log && fail "$deck on $ranks ranks: replicated run logs a sharded update"
  done
done
# With the MPI progress thread (it tests the buckets while backward computes; the gathers run once it is parked).
for layout in replicated sharded; do
  HPCTRAIN_MPI_PROGRESS=thread HPCTRAIN_MPI_OPTIMIZER=$layout run_ranks 2 train adamw.toml --output thread-$layout \
    >thread-$layout.log 2>&1 && continue
  grep -q "needs MPI_THREAD_SERIALIZED" thread-$layout.log && echo "skipped: no MPI_THREAD_SERIALIZED" ||
    { cat thread-$layout.log >&2; fail "progress thread, $layout"; }
done
# A default run (no variable) is sharded; a sharded run resumed from its step-6 checkpoint ends where it did.
run_ranks 2 train adamw.toml --output adamw-default >adamw-default.log 2>&1 || { cat adamw-default.log >&2; fail "default run"; }
grep -q "each rank updates its slice" adamw-default.log || fail "the default run on 2 ranks is not sharded"
run_ranks 2 train adamw.toml --output adamw-resumed --resume adamw-2-sharded/checkpoints/step-00000006.h5 \
  >adamw-resumed.log 2>&1 || { cat adamw-resumed.log >&2; fail "resumed run"; }
# The same checkpoint resumed on 3 ranks (each reads its own thirds of the state), sharded and replicated: the same end.
for layout in replicated sharded; do
  HPCTRAIN_MPI_OPTIMIZER=$layout run_ranks 3 train adamw.toml --output on-3-$layout \
    --resume adamw-2-sharded/checkpoints/step-00000006.h5 >on-3-$layout.log 2>&1 ||
    { cat on-3-$layout.log >&2; fail "resumed on 3 ranks, $layout"; }
done

$PYTHON - <<'PY' || fail "the sharded update's results differ from the replicated one's"
import h5py, numpy as np

def datasets(path, group):
    found = {}
    with h5py.File(path, "r") as f:
        f[group].visititems(lambda name, item: found.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    return found

def same(a, b, what):
    for group in ("/model", "/optimizer"):
        x, y = datasets(a, group), datasets(b, group)
        assert x.keys() == y.keys() and x, (what, group, sorted(x), sorted(y))
        for name in x:
            assert x[name].tobytes() == y[name].tobytes(), f"{what}: {group}/{name} differs"
    print(f"{what}: /model and /optimizer identical")

for deck in ("adamw", "sgd", "tiny"):
    for ranks in (2, 3):
        runs = {layout: f"{deck}-{ranks}-{layout}" for layout in ("replicated", "sharded")}
        same(*(f"{run}/checkpoints/step-00000012.h5" for run in runs.values()), f"{deck} on {ranks} ranks")
        metrics = [h5py.File(f"{run}/metrics.h5", "r") for run in runs.values()]
        for key in ("/train/loss", "/train/grad_norm"):
            a, b = (m[key][:] for m in metrics)
            assert len(a) == 12 and np.all(np.isfinite(a)) and a.tobytes() == b.tobytes(), (deck, ranks, key, a, b)
        loss = metrics[0]["/train/loss"][:]
        assert loss[-1] < loss[0] if deck != "sgd" else len(set(loss)) > 6, (deck, ranks, "no training", loss)
same("adamw-2-sharded/checkpoints/step-00000012.h5", "adamw-default/checkpoints/step-00000012.h5", "default run")
same("adamw-2-sharded/checkpoints/step-00000012.h5", "adamw-resumed/checkpoints/step-00000012.h5", "resumed run")
same("on-3-replicated/checkpoints/step-00000012.h5", "on-3-sharded/checkpoints/step-00000012.h5", "resumed on 3 ranks")
import os
if os.path.exists("thread-sharded/checkpoints/step-00000012.h5"):
    same("thread-replicated/checkpoints/step-00000012.h5", "thread-sharded/checkpoints/step-00000012.h5",
         "progress thread")
PY

# A sharded resume reads each rank's part of the optimizer state only, yet every tensor's checksum is checked whole:
# a value changed in rank 0's part or in rank 1's part of exp_avg (the first and the last element) is found.
$PYTHON - <<'PY' || fail "could not write the damaged checkpoints"
import h5py, shutil
for name, index in (("first", 0), ("last", -1)):
    path = f"damaged-{name}.h5"
    shutil.copy("adamw-2-sharded/checkpoints/step-00000006.h5", path)
    with h5py.File(path, "r+") as f:
        tensor = f["/optimizer/exp_avg/linear0/weight" if index == 0 else "/optimizer/exp_avg/linear6/bias"]
        values = tensor[()]
        values.flat[index] += 1.0
        tensor[...] = values
PY
for name in first last; do
  run_ranks 2 train adamw.toml --output damaged-$name --resume damaged-$name.h5 >damaged-$name.log 2>&1 &&
    fail "a resume from a checkpoint with its $name exp_avg value changed ran"
  grep -q "exp_avg/linear.*fails its checksum" damaged-$name.log ||
    { cat damaged-$name.log >&2; fail "damaged $name exp_avg value: no checksum error"; }
done
finish
