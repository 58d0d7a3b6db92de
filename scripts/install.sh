#!/usr/bin/env bash
# Installs what edgedyn's host toolchain and its tests need: Debian packages (aarch64 cross compiler, qemu-user,
# mmdebstrap for the emulated board) and edgedyn itself with every extra.
# Used by the README's quick start, by .ci/run and by the Dockerfile, so a missing step fails everywhere at once.
#
# Where edgedyn goes: into $PYTHON (default python3) when its pip may install there; when that interpreter is
# externally managed (PEP 668: Debian 12, Ubuntu 23.04+) or has no pip, into a virtual environment ($EDGEDYN_VENV,
# default .venv in this checkout), made with that interpreter. The last line says where `edgedyn` landed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  g++ binutils                                                            # TVM links x86 libraries with g++
  gcc-aarch64-linux-gnu g++-aarch64-linux-gnu binutils-aarch64-linux-gnu  # link TVM code for arm64 boards
  qemu-user-static mmdebstrap debian-archive-keyring                      # the emulated aarch64 board in tests/board
  qemu-user gcc                                                           # count its instructions (qemu-aarch64 loads a plugin)
)
[ "$(id -u)" -eq 0 ] || APT_PACKAGES+=(uidmap)  # mmdebstrap as non-root needs newuidmap (not pulled in by default)
PYTHON=${PYTHON:-python3}
VENV=${EDGEDYN_VENV:-.venv}

# Exit status 0 when $PYTHON's own pip must not or cannot install edgedyn (and no venv is active).
needs_venv() {
  "$PYTHON" - <<'EOF'
import importlib.util, os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
has_pip = importlib.util.find_spec("pip") is not None
sys.exit(0 if not in_venv and (managed or not has_pip) else 1)
EOF
}

# Debian ships venv's pip bootstrap (ensurepip) in python3-venv, which a stock install lacks.
can_make_venv() {
  "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1
}

apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install.sh: apt-get install $*" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "install.sh: no $PYTHON here; install Python 3.10 or newer (Debian: apt-get install python3) or set PYTHON=" >&2
  exit 2
fi

use_venv=false
if needs_venv; then
  use_venv=true
fi

if command -v apt-get >/dev/null 2>&1; then
  wanted=("${APT_PACKAGES[@]}")
  if $use_venv && [ ! -x "$VENV/bin/python" ] && ! can_make_venv; then
    wanted+=(python3-venv)
  fi
  missing=()
  for package in "${wanted[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
else
  echo "install.sh: no apt-get here; install ${APT_PACKAGES[*]} with your package manager for the aarch64 boards" >&2
fi

if $use_venv; then
  if [ ! -x "$VENV/bin/python" ]; then
    echo "install.sh: $PYTHON is externally managed or has no pip; making a virtual environment in $VENV" >&2
    "$PYTHON" -m venv "$VENV"
  fi
  PYTHON="$VENV/bin/python"
fi

echo "install.sh: pip install -e '.[all]' into $("$PYTHON" -c 'import sys; print(sys.executable)')" >&2
# torch is pinned (==2.14.1) in pyproject, with torchvision built for it: a looser spec pulls whatever is newest.
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[all]"
if command -v pyenv >/dev/null 2>&1 && ! $use_venv; then
  pyenv rehash  # make the new `edgedyn` script visible through pyenv's shims
fi
bindir=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
if $use_venv; then
  echo "install.sh: done; edgedyn is $bindir/edgedyn (put it on PATH: export PATH=\"$bindir:\$PATH\")" >&2
else
  echo "install.sh: done; edgedyn is $bindir/edgedyn; try: edgedyn boards" >&2
fi
