"""The real-GPU check: build the reference models for this machine's NVIDIA GPU (x86 host), run them through
edgedyn.runtime on the GPU, compare with torch, and time them against torch eager on the same GPU.

    bash tests/gpu/run_on_nvidia.sh            # on any Linux machine with an NVIDIA GPU and driver (CUDA 12.6+)
    python tests/gpu/check_gpu.py --arch sm_90 --build-only   # without a GPU: check the build half only

Prints a table and writes tests/gpu/results.json. Exit status 1 when an output differs beyond tolerance.
"""
import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import edgedyn  # noqa: E402
import edgedyn.runtime as rt  # noqa: E402
from edgedyn.frontend.loading import load_reference  # noqa: E402
from edgedyn.runtime.devices import cuda_driver  # noqa: E402

MODELS = {
    "tiny_cnn": ("tiny_cnn.py:TinyCNN", (1, 3, 64, 64)),
    "mobilenet_v2": ("mobilenet_v2.py:MobileNetV2", (1, 3, 96, 96)),
    "mlp": ("mlp.py:MLP", (8, 64)),
    "transformer_block": ("transformer_block.py:TransformerBlock", (1, 32, 64)),
}
RTOL = 1e-4


def local_board(directory: Path, arch: str) -> Path:
    """A board file for this x86 machine with its GPU, through edgedyn's own user-board support."""
    (directory / "local-cuda.toml").write_text(f'''name = "local-cuda-{arch}"
description = "This machine's NVIDIA GPU ({arch}) with an x86-64 host"
kind = "cuda"
arch = "x86_64"
[tvm]
kind = "cuda"
arch = "{arch}"
[tvm_host]
kind = "llvm"
mtriple = "x86_64-linux-gnu"
mcpu = "x86-64-v2"
''')
    board = directory / "local-gpu.toml"
    board.write_text(f'''name = "local-gpu"
description = "This x86-64 machine with its NVIDIA GPU ({arch})"
arch = "x86_64"
[cpu]
model = "this machine's x86-64 CPU"
cores = 4
[memory]
ram_mb = 16384
budget_mb = 12288
[gpu]
name = "local NVIDIA GPU"
arch = "{arch}"
compute_capability = "{arch[3:-1]}.{arch[-1]}"
cuda_cores = 1
[os]
name = "Linux"
python = "3.11"
cuda = "12.6"
glibc = "2.28"
[targets]
cpu_target = "x86-64-v2"
gpu_target = "local-cuda.toml"
[backends]
preference = ["tvm"]
''')
    return board


def median_ms(function: Any, seconds: float = 2.0) -> float:
    for _ in range(5):
        function()
    times: List[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 20 or time.perf_counter() < deadline:
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1e3)
        if len(times) >= 2000:
            break
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", help="sm_XX to build for (default: this machine's GPU)")
    parser.add_argument("--build-only", action="store_true", help="export only; no GPU needed")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    options = parser.parse_args()
    driver = cuda_driver()
    arch = options.arch
    if arch is None:
        if not driver["available"]:
            print(f"no usable NVIDIA GPU here: {driver['reason']}", file=sys.stderr)
            return 2
        arch = "sm_" + driver["devices"][0]["compute_capability"].replace(".", "")
    torch_gpu = torch.cuda.is_available()
    rows: List[Dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="edgedyn-gpu-") as workdir:
        board = local_board(Path(workdir), arch)
        for name in options.models:
            reference, shape = MODELS[name]
            model, _, _ = load_reference(str(REPO / "examples" / reference))
            model.eval()
            example = torch.randn(*shape)
            started = time.perf_counter()
            bundle = edgedyn.export(model, (example,), board=str(board), backend="tvm", device="gpu",
                                    output=Path(workdir) / f"{name}.edgedyn", verify=False)
            row: Dict[str, Any] = {"model": name, "arch": arch, "export_s": round(time.perf_counter() - started, 1)}
            gpu = rt.read_manifest(bundle)["specializations"][0]["artifacts"][0]["gpu"]
            row.update(ptx_isa=gpu["ptx_isa"], kernels=gpu["kernels"])
            if not options.build_only:
                program = rt.load(bundle, device="gpu")
                x = np.random.default_rng().standard_normal(shape).astype(np.float32)
                with torch.no_grad():
                    expected = model(torch.from_numpy(x)).numpy()
                actual = program(x)
                error = float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))
                row.update(max_rel_error=error, ok=error <= RTOL, edgedyn_gpu_ms=median_ms(lambda: program(x)))
                failed |= not row["ok"]
                if torch_gpu:
                    cuda_model, cuda_x = model.cuda(), torch.from_numpy(x).cuda()

                    def eager() -> None:
                        with torch.no_grad():
                            cuda_model(cuda_x).cpu()  # include the copy back, as edgedyn's call returns numpy
                    row["torch_eager_gpu_ms"] = median_ms(eager)
                    row["speedup_vs_torch"] = row["torch_eager_gpu_ms"] / row["edgedyn_gpu_ms"]
                    model.cpu()
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {"machine": platform.node(), "driver": driver, "torch": torch.__version__, "torch_cuda": torch_gpu,
               "rows": rows}
    if not options.build_only:
        (Path(__file__).parent / "results.json").write_text(json.dumps(summary, indent=2))
    print("\nmodel              arch   rel.err   edgedyn ms  torch ms  speedup")
    for r in rows:
        print(f"{r['model']:<18} {r['arch']:<6} {r.get('max_rel_error', float('nan')):8.1e}  "
              f"{r.get('edgedyn_gpu_ms', float('nan')):9.3f}  {r.get('torch_eager_gpu_ms', float('nan')):8.3f}  "
              f"{r.get('speedup_vs_torch', float('nan')):6.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
