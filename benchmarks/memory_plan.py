"""Memory plans of the examples and reference models: naive, planned arena and lower bound, plus what TVM allocates.

    python benchmarks/memory_plan.py                    # table on stdout, JSON in memory_plan.json
    python benchmarks/memory_plan.py --no-tvm --json out.json

Three plans per specialization:
- graph: the tensors of the optimized ATen graph (inputs, intermediates, outputs), in-place reuse, greedy by size;
- portable: what the portable executor really allocates (the graph plan plus each kernel's scratch);
- tvm: the bytes of `R.vm.alloc_storage` in the Relax module after TVM's default pipeline (its static block memory
  planner), for intermediates and outputs; its kernels' own scratch lives inside TIR and is not counted.
"""
import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODELS = {
    "loop_example": ("loop_example.py:loop_example", ["x=2x3", "n=4"]),
    "tiny_cnn": ("tiny_cnn.py:TinyCNN", ["x=1x3x64x64"]),
    "mlp": ("mlp.py:MLP", ["x=1x64", "x=8x64"]),
    "mobilenet_v2": ("mobilenet_v2.py:MobileNetV2", ["x=1x3x96x96", "x=8x3x96x96"]),
    "transformer_block": ("transformer_block.py:TransformerBlock", ["x=1x32x64"]),
}


def tvm_storage_bytes(program: Any) -> int:
    """Bytes of every storage the Relax VM allocates (R.vm.alloc_storage) after TVM's default CPU pipeline."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from edgedyn.torch_quiet import quiet_torch

    with quiet_torch():
        module = from_exported_program(program, keep_params_as_input=True, unwrap_unit_return_tuple=True)
    module, _ = relax.frontend.detach_params(module)
    module = relax.transform.DecomposeOpsForInference()(module)
    target = tvm.target.Target({"kind": "llvm"})
    with target:
        lowered = relax.get_default_pipeline(target)(module)
    text = lowered.script()
    return sum(int(size) for size in re.findall(r"R\.vm\.alloc_storage\(R\.shape\(\[(\d+)\]\)", text))


def measure(use_tvm: bool) -> List[Dict[str, Any]]:
    from edgedyn.backends import portable
    from edgedyn.backends.artifact import Build
    from edgedyn.boards import load_board
    from edgedyn.frontend import capture
    from edgedyn.passes import run_pipeline
    from edgedyn.passes.memory_check import check_plan
    from edgedyn.passes.memory_plan import plan_program

    board = load_board("x86-64")
    rows = []
    for model, (reference, inputs) in MODELS.items():
        captured = capture(str(REPO / "examples" / reference), inputs=inputs)
        for spec in captured.specializations:
            program = run_pipeline(spec.program)
            graph = plan_program(program)
            check_plan(graph)
            artifact = portable.lower(Build(program=program, board=board, target=board.target("cpu"),
                                            tensor_inputs=list(spec.tensor_inputs)))
            row = {"model": model, "specialization": spec.name, "graph": graph.summary(),
                   "portable": artifact.meta["memory"]}
            if use_tvm:
                started = time.perf_counter()
                row["tvm_storage_bytes"] = tvm_storage_bytes(program)
                row["tvm_seconds"] = round(time.perf_counter() - started, 1)
            rows.append(row)
            print(_line(row), flush=True)
    return rows


HEADER = "{:<18} {:<14} {:>10} {:>10} {:>10} {:>6} {:>6} | {:>10} {:>10} {:>6} | {:>10}".format(
    "model", "input", "naive", "arena", "bound", "a/lb", "a/nv", "port.arena", "port.bound", "a/lb", "tvm")


def _line(row: Dict[str, Any]) -> str:
    g, p = row["graph"], row["portable"]
    return "{:<18} {:<14} {:>10,} {:>10,} {:>10,} {:>6.2f} {:>6.2f} | {:>10,} {:>10,} {:>6.2f} | {:>10}".format(
        row["model"], row["specialization"], g["naive_bytes"], g["arena_bytes"], g["lower_bound_bytes"],
        g["arena_bytes"] / g["lower_bound_bytes"], g["arena_bytes"] / g["naive_bytes"], p["arena_bytes"],
        p["lower_bound_bytes"], p["arena_bytes"] / p["lower_bound_bytes"],
        "{:,}".format(row["tvm_storage_bytes"]) if "tvm_storage_bytes" in row else "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("memory_plan.json"), help="where to write the results")
    parser.add_argument("--no-tvm", action="store_true", help="skip TVM's numbers (no apache-tvm needed)")
    options = parser.parse_args()
    print(HEADER)
    rows = measure(use_tvm=not options.no_tvm)
    options.json.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    print("wrote {}".format(options.json), file=sys.stderr)


if __name__ == "__main__":
    main()
