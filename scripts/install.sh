#!/usr/bin/env bash
# Installs what edgedyn's host toolchain and its tests need: Debian packages (aarch64 cross compiler, qemu-user,
# mmdebstrap for the emulated board) and edgedyn itself with every extra, into the current python3.
# Used by the README's quick start, by .ci/run and by the Dockerfile, so a missing step fails everywhere at once.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  g++ binutils                                                            # TVM links x86 libraries with g++
  gcc-aarch64-linux-gnu g++-aarch64-linux-gnu binutils-aarch64-linux-gnu  # link TVM code for arm64 boards
  qemu-user-static mmdebstrap debian-archive-keyring                      # the emulated aarch64 board in tests/board
)
PYTHON=${PYTHON:-python3}

if command -v apt-get >/dev/null 2>&1; then
  missing=()
  for package in "${APT_PACKAGES[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "install.sh: apt-get install ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "install.sh: no apt-get here; install ${APT_PACKAGES[*]} with your package manager for the aarch64 boards" >&2
fi

echo "install.sh: pip install -e '.[all]' into $($PYTHON -c 'import sys; print(sys.executable)')" >&2
# torch is pinned (==2.13.0) in pyproject: a looser spec pulls a multi-GB CUDA build.
$PYTHON -m pip install --quiet --disable-pip-version-check -e ".[all]"
if command -v pyenv >/dev/null 2>&1; then
  pyenv rehash  # make the new `edgedyn` script visible through pyenv's shims
fi
echo "install.sh: done; try: edgedyn boards" >&2
