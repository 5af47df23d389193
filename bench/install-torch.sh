#!/usr/bin/env bash
# Opt-in: install the PyTorch that bench/torch_twin.py compares hpctrain against. Never run by the tests or by
# bench/run.sh (which only reports "not installed" and skips the torch rows when torch is missing).
#
# Debian's python3-torch is preferred over PyPI's wheel: PyPI serves only the CUDA build for Linux x86_64, which pulls
# several GB of nvidia-* packages a CPU benchmark never uses. Debian's build links the system oneDNN (libdnnl2, the same
# library hpctrain uses; torch's bf16 matmuls run through it) and the system BLAS for fp32 matmuls. The BLAS alternative
# defaults to the netlib reference implementation, which would make the twin a straw man, so OpenBLAS is installed with
# it (libopenblas0-pthread registers itself as the preferred libblas.so.3).
#
# As root it runs apt-get; otherwise it prints the command. Idempotent.
set -euo pipefail
packages=(python3-torch libopenblas0-pthread)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  echo "install-torch: python3-torch and OpenBLAS already installed"
else
  command=(apt-get install -y --no-install-recommends "${missing[@]}")
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-torch: missing packages; run as root:" >&2
    echo "  apt-get update && ${command[*]}" >&2
    exit 1
  fi
  echo "install-torch: installing ${missing[*]} (Debian's PyTorch pulls about 160 packages, ~1 GB)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  "${command[@]}"
fi
/usr/bin/python3 -c 'import torch; print("install-torch: torch", torch.__version__, "importable by /usr/bin/python3")'
