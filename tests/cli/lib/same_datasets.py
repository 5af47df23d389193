"""same_datasets.py A.h5 B.h5: exit 0 when the two HDF5 files hold the same datasets, bit for bit (a resumed run's
checkpoint against the uninterrupted run's); otherwise an assertion naming the datasets that differ."""
import sys

import h5py
import numpy as np


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: out.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    return out


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), (a.keys() ^ b.keys())
different = [k for k in a if not np.array_equal(a[k], b[k])]
assert not different, f"differ: {different}"
print(f"{len(a)} datasets bit-identical")
