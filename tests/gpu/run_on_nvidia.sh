#!/usr/bin/env bash
# One command on any machine with an NVIDIA GPU (driver for CUDA 12.6 or newer): install edgedyn with the
# GPU build tools, build the reference models for this GPU, run them through edgedyn.runtime, compare with
# torch and time them against torch eager. Under 5 minutes on a recent GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! python3 -c "import edgedyn, tvm, nvidia.cuda_nvrtc" 2>/dev/null; then
  python3 -m pip install --quiet -e ".[export,tvm,cuda]"
fi
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv || true
timeout 300 python3 tests/gpu/check_gpu.py "$@"
