#!/usr/bin/env bash
# Opt-in: install the PyTorch that bench/torch_twin.py compares hpctrain against: PyTorch >= 2 from the package index
# (PyPI), into a virtual environment (default bench/.venv, ignored by git; HPCTRAIN_TORCH_VENV=DIR elsewhere). Never
# run by the tests; bench/run.sh uses the environment's python when it exists and skips the torch rows otherwise.
#
#   bench/install-torch.sh            torch 2.15.0 (TORCH_VERSION=X.Y.Z for another)
#
# PyPI's only Linux x86_64 wheel is the CUDA build, whose dependencies are several GB of nvidia-* packages a CPU
# benchmark never uses. Installing it with --no-deps is not enough: libtorch_cuda.so is loaded by `import torch` even
# on a CPU-only machine and needs its CUDA libraries to load. So this script installs
#   - torch itself with --no-deps, then its pure-Python dependencies (read from the wheel's metadata);
#   - only the nvidia-* packages whose libraries the CUDA toolkit on this machine (/usr/local/cuda, found through
#     ldconfig: cudart, cuBLAS, cuFFT, cuSPARSE, cuSOLVER, NVRTC, cuDNN) does not provide in a version torch links:
#     cuFile, cuSPARSELt, NVSHMEM, NCCL (~520 MB instead of several GB), at the versions torch's metadata pins.
# `import torch` then works and torch runs on the CPU (MKL for fp32, its own oneDNN for bf16). Without a CUDA 13
# toolkit the import check at the end fails and says which library is missing. Debian's python3 with
# --system-site-packages keeps Debian's h5py. Idempotent.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HPCTRAIN_TORCH_VENV:-$ROOT/bench/.venv}
VERSION=${TORCH_VERSION:-2.15.0}
BASE_PYTHON=/usr/bin/python3  # Debian's python3: has h5py (a pyenv python3 may come first on PATH)

if [[ ! -x $VENV/bin/python ]]; then
  echo "install-torch: creating $VENV"
  "$BASE_PYTHON" -m venv --system-site-packages "$VENV" ||
    { echo "install-torch: '$BASE_PYTHON -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
PYTHON=$VENV/bin/python
pip_install() { "$PYTHON" -m pip install --disable-pip-version-check --progress-bar off -q "$@"; }

echo "install-torch: torch $VERSION (--no-deps, ~540 MB download)"
pip_install --no-deps "torch==$VERSION"

# Requirements from torch's metadata: the pure-Python ones (no platform marker, no extra), and the pins of the
# nvidia packages named below.
mapfile -t requirements < <("$PYTHON" - <<'EOF'
from importlib.metadata import requires
import re

nvidia = ("nvidia-cusparselt", "nvidia-nvshmem", "nvidia-nccl")
for requirement in requires("torch") or []:
    spec, _, marker = requirement.partition(";")
    name = re.split(r"[<>=~!\[ ]", spec.strip(), maxsplit=1)[0].lower()
    if "extra ==" in marker:
        continue
    if not marker.strip():
        print("python", spec.strip())
    elif name.startswith(nvidia):
        print("nvidia", spec.strip())
EOF
)
python_packages=() nvidia_packages=(nvidia-cufile)
for line in "${requirements[@]}"; do
  if [[ $line == python\ * ]]; then python_packages+=("${line#python }"); else nvidia_packages+=("${line#nvidia }"); fi
done
echo "install-torch: pure-Python dependencies: ${python_packages[*]}"
pip_install "${python_packages[@]}"
# cuFile comes from torch's cuda-toolkit[cufile] requirement (the toolkit package would pull every library); its
# library keeps the soname libcufile.so.0 across versions.
echo "install-torch: CUDA libraries the toolkit here lacks: ${nvidia_packages[*]}"
pip_install --no-deps "${nvidia_packages[@]}"

"$PYTHON" - <<'EOF'
import torch

x = torch.randn(64, 64)
assert torch.isfinite(x @ x).all()
print(f"install-torch: torch {torch.__version__} imports and runs on the CPU "
      f"({torch.get_num_threads()} threads, oneDNN {torch.backends.mkldnn.is_available()})")
EOF
echo "install-torch: bench/run.sh and bench/torch_twin.py use $PYTHON"
