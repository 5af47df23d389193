#!/usr/bin/env bash
# Bad data gets one clear message and a non-zero exit, on 1 or several ranks: shapes that do not fit the model, stored
# types that are not numbers, a glob matching nothing, files of one split that disagree, damaged HDF5 files, a bad
# .npy header, CSV rows that are ragged or not numbers.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 512 1

cat >deck.toml <<'TOML'
[run]
seed = 1
[data]
train = "train.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 3
TOML

$PYTHON - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(0)
y = rng.integers(0, 3, 256).astype(np.int32)
def write(name, **datasets):
    with h5py.File(name, "w") as f:
        for key, value in datasets.items():
            f[key] = value
write("flat.h5", features=rng.standard_normal(256).astype(np.float32), labels=y)
write("images.h5", features=rng.integers(0, 255, (256, 1, 4, 4)).astype(np.uint8), labels=y)
write("wide_labels.h5", features=rng.standard_normal((256, 2)).astype(np.float32), labels=np.zeros((256, 3), np.int32))
write("targets.h5", features=rng.standard_normal((256, 2)).astype(np.float32),
      targets=rng.standard_normal((256, 2)).astype(np.float32))
write("strings.h5", features=np.array([b"abc"] * 256), labels=y)
compound = np.zeros(256, dtype=[("x", np.float32), ("y", np.float32)])
write("compound.h5", features=compound, labels=y)
write("part_a.h5", features=rng.standard_normal((128, 2)).astype(np.float32), labels=y[:128])
write("part_b.h5", features=rng.standard_normal((128, 1, 2)).astype(np.float32), labels=y[128:])
# A compressed file with one damaged chunk (the bytes of chunk 1 overwritten)
with h5py.File("damaged.h5", "w") as f:
    f.create_dataset("features", data=rng.standard_normal((4096, 2)).astype(np.float32), chunks=(512, 2),
                     compression="gzip", shuffle=True)
    f["labels"] = rng.integers(0, 3, 4096).astype(np.int32)
    info = f["features"].id.get_chunk_info(1)
with open("damaged.h5", "r+b") as f:
    f.seek(info.byte_offset)
    f.write(b"\x5a" * info.size)
data = open("train.h5", "rb").read()
open("truncated.h5", "wb").write(data[: len(data) // 2])
open("garbage.h5", "wb").write(bytes(range(256)) * 64)
open("bad_header.npy", "wb").write(b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (3,)}   \n")
np.save("labels.npy", y)
open("ragged.csv", "w").write("1,2,0\n3,4,1\n5,6\n7,8,2\n")
open("words.csv", "w").write("x,y,label\n1,2,0\n3,four,1\n")
PY

# shapes that do not fit the model
expect_error features_one_dimensional "features '/features' in '.*flat.h5' have shape \(256\); expected \(samples, features...\)" 2 \
  train deck.toml --set data.train=flat.h5
expect_error features_width_vs_model "layer 'linear0' expects 10 input features, but 16 arrive" 2 \
  train deck.toml --set data.train=images.h5 --set 'model.layers[0].in=10'
expect_error labels_not_one_per_sample "labels '/labels' in '.*wide_labels.h5' have shape \(256, 3\); cross_entropy needs one integer label" 2 \
  train deck.toml --set data.train=wide_labels.h5
expect_error targets_vs_model_outputs "the model has 3 outputs but the targets '/targets' have 2 columns" 2 \
  train deck.toml --set data.train=targets.h5 --set model.loss=mse
# stored types that are not numbers
expect_error string_features "'/features' in '.*strings.h5' holds string values; expected integers or floating point" 2 \
  train deck.toml --set data.train=strings.h5
expect_error compound_features "holds compound values; expected integers or floating point" 2 \
  train deck.toml --set data.train=compound.h5
# file lists and patterns
expect_error glob_matches_nothing "data.train: the pattern '.*/nothing_\*.h5' matches no file" 2 \
  train deck.toml --set 'data.train=nothing_*.h5'
expect_error split_shapes_differ "'.*part_b.h5' holds samples of shape \(1, 2\) in '/features', but '.*part_a.h5' holds \(2\)" 2 \
  train deck.toml --set 'data.train=part_*.h5'
# damaged files
expect_error truncated_hdf5 "data file '.*truncated.h5' is not an HDF5 file or is damaged" 2 \
  train deck.toml --set data.train=truncated.h5
expect_error garbage_hdf5 "data file '.*garbage.h5' is not an HDF5 file or is damaged" 2 \
  train deck.toml --set data.train=garbage.h5
expect_error damaged_chunk "reading '/features' from '.*damaged.h5' failed" 2 \
  train deck.toml --set data.train=damaged.h5
# converters
expect_error npy_bad_header "'bad_header.npy' is not a valid .npy file: bad header \(no 'fortran_order'" 1 \
  data convert --features bad_header.npy --labels labels.npy --output out.h5
expect_error csv_ragged_row "'ragged.csv' line 3 has 2 columns, but line 1 has 3" 1 \
  data convert --csv ragged.csv --label-column -1 --output out.h5
expect_error csv_not_a_number "'words.csv' line 3, column 2 \('y'\): 'four' is not a number" 1 \
  data convert --csv words.csv --header --label-column label --output out.h5
[[ ! -e out.h5 && ! -e out.h5.partial ]] && pass "no output file after failed conversions" || fail "output left behind"
# a misspelt option of a data command gets the deck reader's suggestions (swapped letters, one letter off)
status=0
"$HPCTRAIN" data generate images --smaples 10 --output typo.h5 >typo.log 2>&1 || status=$?
((status == 2)) && grep -q "unknown option '--smaples'" typo.log && grep -q "did you mean '--samples'?" typo.log &&
  [[ ! -e typo.h5 ]] && pass "data generate --smaples: did you mean '--samples'" || { cat typo.log >&2; fail "option typo"; }
finish
