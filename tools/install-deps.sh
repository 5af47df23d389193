#!/usr/bin/env bash
# Install the system packages hpctrain needs (Debian 12), only those missing. As root it runs apt-get; otherwise it
# prints the exact command to run. Idempotent: a second run installs nothing.
set -euo pipefail
# ocl-icd-opencl-dev: Debian's oneDNN is built with the OpenCL GPU runtime and its CMake config requires OpenCL
# (only a recommendation of libdnnl-dev, which --no-install-recommends skips).
packages=(build-essential cmake ninja-build ccache pkg-config
  libopenmpi-dev openmpi-bin libhdf5-openmpi-dev hdf5-tools libdnnl-dev ocl-icd-opencl-dev libtomlplusplus-dev libgtest-dev zlib1g-dev
  python3-h5py python3-numpy python3-matplotlib)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all packages present"
  exit 0
fi
command=(apt-get install -y --no-install-recommends "${missing[@]}")
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages; run as root:" >&2
  echo "  apt-get update && ${command[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
"${command[@]}"
