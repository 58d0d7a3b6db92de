"""How much of each gate a model's own sensitivity spends: its outputs with the weights rounded as int8 rounds them,
or computed in bf16, against its exact fp32 outputs, in torch, before any runtime is involved.

    python benchmarks/conditioning.py                                 # the full-size CNNs and the detector
    python benchmarks/conditioning.py --models tv-resnet18,timm-mobilenetv4_conv_small --inputs 16

An int8 artifact rounds every weight to one of 255 steps of its output channel's largest magnitude (per-channel
symmetric, as NNCF, onnxruntime and TFLite quantize weights) and its activations too; a bf16 one keeps 8 bits of
each value's mantissa. How far a model's outputs move under the same rounding depends on the model: a network
whose layers amplify small errors (in its weights or its batch norms) moves far under either. Per model this prints
the mean cosine to the exact fp32 outputs (the worst output's, as edgedyn's gates read them) of
- `int8 weights`: only the weights of every convolution and linear layer rounded to int8 per output channel, the
  arithmetic in fp32: a bound on what any int8 scheme with such weights reaches, whatever it does with
  activations (activation rounding only moves the outputs further);
- `weights +-0.1%`: each of those weights moved by Gaussian noise of 0.1% of its channel's largest magnitude
  (smaller than int8's rounding, whose error spreads 0.23%): how sensitive the model is, as one number;
- `bf16`: the module and its inputs in bfloat16, every tensor between layers too (torch's CPU kernels): harsher
  than a runtime that keeps elementwise layers and fused post-ops in fp32 (OpenVINO's bf16 reaches 0.9991 on
  MobileNetV3-Large, where this column says 0.9975), so a sensitivity, not a bound;
against edgedyn's gates (int8: cosine 0.99, reduced floats: 0.999). A model whose `int8 weights` is below 0.99
misses the int8 gate with every layer int8 on every backend, whatever the calibration: an int8 artifact of it
passes only with layers kept float (the float prefixes of backends/openvino_int8.py). Models as
benchmarks/fullsize.py builds them (random weights, batch norms measured on their activations), random-normal inputs
drawn apart from those. Table as Markdown; JSON with the machine to benchmarks/results/DATE-conditioning.json.
"""
import argparse
import copy
import datetime
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

RESULTS = REPO / "benchmarks" / "results"
DEFAULT_MODELS = ("tv-resnet18", "tv-mobilenet_v2", "tv-mobilenet_v3_large", "tv-efficientnet_b0",
                  "tv-deeplabv3_mobilenet_v3_large", "timm-mobilenetv4_conv_small", "yolo11n")
GATES = {"int8 weights": 0.99, "weights +-0.1%": None, "bf16": 0.999}
NOISE = 1e-3


def _weighted(module: Any) -> List[Any]:
    import torch

    return [m for m in module.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.Conv1d))]


def int8_weights(module: Any) -> Any:
    """A copy of `module` whose convolution and linear weights are rounded to int8 per output channel (symmetric:
    the step is the channel's largest magnitude over 127) and stored back as fp32."""
    import torch

    rounded = copy.deepcopy(module)
    with torch.no_grad():
        for layer in _weighted(rounded):
            weight = layer.weight
            dims = tuple(range(1, weight.dim()))
            step = weight.abs().amax(dim=dims, keepdim=True).clamp_min(1e-30) / 127.0
            weight.copy_(torch.clamp(torch.round(weight / step), -127, 127) * step)
    return rounded


def noisy_weights(module: Any, share: float = NOISE, seed: int = 0) -> Any:
    """A copy of `module` with each convolution and linear weight moved by Gaussian noise of `share` of its output
    channel's largest magnitude."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    moved = copy.deepcopy(module)
    with torch.no_grad():
        for layer in _weighted(moved):
            weight = layer.weight
            scale = weight.abs().amax(dim=tuple(range(1, weight.dim())), keepdim=True)
            weight.add_(torch.randn(weight.shape, generator=generator) * scale * share)
    return moved


def worst_mean_cosine(run: Callable[[Any], Any], inputs: List[Any], references: List[List[Any]]) -> float:
    """The lowest over outputs of the mean over inputs of the cosine of `run`'s output to the reference: the
    cosine edgedyn's gates read (edgedyn.quantize.accuracy.worst_cosine)."""
    from edgedyn.quantize.accuracy import worst_cosine

    got = [[o.detach().float().numpy() for o in _outputs(run(x))] for x in inputs]
    return worst_cosine(got, [[o.detach().float().numpy() for o in wanted] for wanted in references])


def _outputs(result: Any) -> List[Any]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def measure(name: str, count: int) -> Dict[str, Any]:
    import torch

    import fullsize

    module, example, kind = fullsize.MODELS[name]()
    generator = torch.Generator().manual_seed(1)  # apart from the batch norms' measuring inputs (seed 0)
    inputs = [torch.randn(tuple(example[0].shape), generator=generator) for _ in range(count)]
    with torch.no_grad():
        references = [_outputs(module(x)) for x in inputs]
        rounded, moved, half = int8_weights(module), noisy_weights(module), copy.deepcopy(module).to(torch.bfloat16)
        return {"kind": kind, "inputs": count, "shape": list(example[0].shape),
                "int8 weights": worst_mean_cosine(rounded, inputs, references),
                "weights +-0.1%": worst_mean_cosine(moved, inputs, references),
                "bf16": worst_mean_cosine(lambda x: [o.float() for o in _outputs(half(x.to(torch.bfloat16)))],
                                          inputs, references)}


def table(models: Dict[str, Dict[str, Any]]) -> str:
    lines = ["| model | int8 weights (gate 0.99) | weights +-0.1% | bf16 (gate 0.999) |", "|---|---:|---:|---:|"]
    for name, row in models.items():
        if "error" in row:
            lines.append("| {} | {} | | |".format(name, row["error"]))
            continue
        cells = []
        for key, gate in GATES.items():
            mark = " (below)" if gate is not None and row[key] < gate else ""
            cells.append("{:.5f}{}".format(row[key], mark))
        lines.append("| {} {} | {} |".format(name, row["shape"][-1], " | ".join(cells)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--inputs", type=int, default=16, help="random-normal inputs per model")
    args = parser.parse_args()
    from compare import machine

    models = {}  # type: Dict[str, Dict[str, Any]]
    for name in [m for m in args.models.split(",") if m]:
        try:
            models[name] = measure(name, args.inputs)
        except Exception as error:  # a model this machine cannot build: say so in its row
            models[name] = {"error": "{}: {}".format(type(error).__name__, str(error).strip()[:200])}
        print(name, json.dumps(models[name]), flush=True)
    print(table(models))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "{}-conditioning.json".format(datetime.date.today().isoformat())
    out.write_text(json.dumps({"machine": machine(), "noise": NOISE, "gates": GATES, "models": models}, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
