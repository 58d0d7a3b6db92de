"""edgedyn's speed against what a user would run instead, per model, each variant in its own process.

    python benchmarks/speed.py                                  # every model below, every variant
    python benchmarks/speed.py --models bert-tiny,two-inputs --rounds 3 --seconds 2
    python benchmarks/speed.py --models zoo:resnet18            # a model of edgedyn.zoo (when installed)

Variants: edgedyn's default export (`--backend auto`, `--precision auto`: fp32 or a reduced precision that passes
its gate, unless --edgedyn-backend says otherwise), edgedyn with `--precision fp32`, edgedyn int8 (`--quantize
int8`, calibrated on random inputs, gated at cosine 0.99), onnxruntime-direct (`torch.onnx.export(model,
dynamo=True)`, default session options), onnxruntime with its transformer optimizer (encoders), OpenVINO as a user
runs it (`openvino.convert_model(model, example_input=...)`, compiled for the CPU with its default precision, which
is bf16 on AVX512_BF16/AMX and fp16 on Arm v8.2, and again with f32), ExecuTorch with XNNPACK (fp32 and int8 PT2E),
torch eager and torch.compile. Every variant is built once by this process, then timed in its own
worker process (onnxruntime's spinning threads slow whatever shares a process with it), in rounds that rotate the
order; the result is the median over rounds of each worker's median. Ratios are against onnxruntime-direct.
JSON goes to benchmarks/results/speed-*.json. The ExecuTorch variants need `pip install 'edgedyn[bench]'`.
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's edgedyn, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parent))  # speed_report beside this file
from speed_report import VARIANTS, add_speedups, joined, summary  # noqa: E402
import fullsize  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
CALIBRATION_SAMPLES, EVAL_SAMPLES = 64, 32


# --- models: name -> builder returning (module in eval mode, example inputs, kind) ---

def _example(reference: str, shapes: Tuple[Tuple[int, ...], ...]) -> Callable[[], Tuple[Any, tuple, str]]:
    def build() -> Tuple[Any, tuple, str]:
        import torch

        path, name = reference.split(":")
        spec = importlib.util.spec_from_file_location("example_" + name, str(REPO / "examples" / path))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        model = getattr(module, name)()
        kind = "encoder" if "transformer" in path else "cnn" if "mobilenet" in path else "other"
        torch.manual_seed(0)
        return model.eval(), tuple(torch.randn(shape) for shape in shapes), kind
    return build


def _rerandomize(model: Any) -> Any:
    """Random-init CNNs from transformers give near-constant logits (zero heads, unit BN statistics): without
    this, accuracy numbers mean nothing."""
    import torch

    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, generator=generator)
        elif isinstance(module, torch.nn.BatchNorm2d):
            with torch.no_grad():
                module.running_mean.normal_(0, 0.1, generator=generator)
                module.running_var.uniform_(0.5, 1.5, generator=generator)
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.normal_(0, 0.1, generator=generator)
        elif isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, 0, 1 / math.sqrt(module.in_features), generator=generator)
    return model


def _logits(inner: Any) -> Any:
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(x).logits

    return Logits().eval()


def _vit() -> Tuple[Any, tuple, str]:
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768,
                       image_size=224, patch_size=16, num_labels=1000)
    return _logits(ViTForImageClassification(config).eval()), (torch.randn(1, 3, 224, 224),), "encoder"


def _bert() -> Tuple[Any, tuple, str]:
    import torch
    from transformers import BertConfig, BertModel

    class Hidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(inputs_embeds=x).last_hidden_state

    torch.manual_seed(0)
    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
    # Embeddings as the input (float): the accuracy gate and calibration need float inputs to vary.
    return Hidden(BertModel(config, add_pooling_layer=False).eval()).eval(), (torch.randn(1, 32, 128),), "encoder"


def _mobilenet_v2_224() -> Tuple[Any, tuple, str]:
    import torch
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    model = _rerandomize(MobileNetV2ForImageClassification(MobileNetV2Config(image_size=224, num_labels=1000)))
    return _logits(model.eval()), (torch.randn(1, 3, 224, 224),), "cnn"


def _resnet18() -> Tuple[Any, tuple, str]:
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], layer_type="basic", num_labels=1000)
    return _logits(_rerandomize(ResNetForImageClassification(config)).eval()), (torch.randn(1, 3, 224, 224),), "cnn"


def _two_inputs() -> Tuple[Any, tuple, str]:
    """The per-call overhead case: almost no compute, two tensor arguments."""
    import torch

    class TwoInputs(torch.nn.Module):
        def forward(self, a: Any, b: Any) -> Any:
            return torch.relu(a * b) + a

    torch.manual_seed(0)
    return TwoInputs().eval(), (torch.randn(1, 16), torch.randn(1, 16)), "call"


MODELS = {
    "mobilenet_v2": _example("mobilenet_v2.py:MobileNetV2", ((1, 3, 96, 96),)),
    "transformer_block": _example("transformer_block.py:TransformerBlock", ((1, 32, 64),)),
    "mlp": _example("mlp.py:MLP", ((1, 64),)),
    "two-inputs": _two_inputs,
    "hf-mobilenet_v2-224": _mobilenet_v2_224,
    "hf-resnet18": _resnet18,
    "hf-vit-tiny-4l": _vit,
    "hf-bert-tiny-32": _bert,
    **fullsize.MODELS,  # full-size torchvision, timm, ultralytics and transformers models (benchmarks/fullsize.py)
}  # type: Dict[str, Callable[[], Tuple[Any, tuple, str]]]


def build_model(name: str) -> Tuple[Any, tuple, str]:
    """(model, example inputs, kind) for a name of MODELS or `zoo:NAME` (edgedyn.zoo: its seeded model, fresh
    example inputs, and its family as the kind: cnn, encoder, ...)."""
    if name.startswith("zoo:"):
        from edgedyn import zoo

        record = zoo.get(name[4:])
        return zoo.build(record.name), tuple(zoo.example_inputs(record.name).values()), record.family
    return MODELS[name]()


def variants_for(kind: str, wanted: List[str]) -> List[str]:
    """The variants that apply to a model kind: no int8 for the call-overhead model, the transformer optimizer
    only for encoders."""
    chosen = []
    for variant in wanted:
        if kind == "call" and ("int8" in variant or variant.startswith("executorch")):
            continue
        if variant == "onnxruntime-transformer-optimizer" and kind != "encoder":
            continue
        chosen.append(variant)
    return chosen


# --- building each variant's file (in this process) ---

def _random_samples(inputs: tuple, count: int, seed: int) -> List[tuple]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [tuple(_random_like(rng, t) for t in inputs) for _ in range(count)]


def _random_like(rng: Any, tensor: Any) -> Any:
    """Normal floats, or token ids in the example's own range (an encoder's ids index its vocabulary)."""
    import numpy as np

    if tensor.is_floating_point():
        return rng.standard_normal(tuple(tensor.shape)).astype(np.float32)
    return rng.integers(0, int(tensor.max()) + 1, tuple(tensor.shape)).astype(str(tensor.dtype).replace("torch.", ""))


def prepare(variant: str, name: str, workdir: Path, args: argparse.Namespace) -> Dict[str, Any]:
    """Writes the files a worker needs for one variant; returns what the worker reads and what was recorded."""
    import torch

    model, inputs, kind = build_model(name)
    base = workdir / "{}-{}".format(name, variant)
    task = {"variant": variant, "model": name}  # type: Dict[str, Any]
    if variant.startswith("edgedyn-"):
        import edgedyn
        from edgedyn.runtime import read_manifest
        from edgedyn.runtime.format import kept_artifact

        options = {"precision": "fp32" if variant == "edgedyn-fp32" else "auto"}  # type: Dict[str, Any]
        if variant == "edgedyn-int8":
            options.update(quantize="int8", calibration=_random_samples(inputs, CALIBRATION_SAMPLES, 1),
                           eval_inputs=_random_samples(inputs, EVAL_SAMPLES, 2))
        path = edgedyn.export(model, inputs, board="x86-64", backend=args.edgedyn_backend,
                              output=str(base) + ".edgedyn", **options)
        task["bundle"] = str(path)
        artifact = kept_artifact(read_manifest(path)["specializations"][0])
        task["recorded"] = {"backend": artifact["backend"], "precision": artifact.get("precision", "fp32"),
                            "selection": artifact.get("selection")}
        if "accuracy" in artifact:
            task["recorded"]["accuracy"] = [o["cosine"] for o in artifact["accuracy"]["outputs"]]
        if "quantization" in artifact:
            quantization = artifact["quantization"]
            task["recorded"]["int8"] = {
                "scheme": quantization.get("scheme"), "float_ops": quantization.get("float_ops"),
                "cosine": [o["cosine"] for o in quantization["accuracy"]["outputs"]]}
    elif variant.startswith("onnxruntime-"):
        direct = str(base) + ".onnx"
        with torch.no_grad():
            torch.onnx.export(model, inputs, direct, dynamo=True, verbose=False)
        task["onnx"] = direct
        if variant == "onnxruntime-transformer-optimizer":
            from onnxruntime.transformers import optimizer

            # opt_level=0: the optimizer's fusions only. Its default first runs onnxruntime's basic optimizations
            # and saves that graph; onnxruntime 1.32 then refuses to open the result at any level above disabled
            # ("AddInitializedOrtValue Attempt to replace the existing tensor"), with no duplicate names in it.
            optimized = optimizer.optimize_model(direct, model_type="bert", num_heads=0, hidden_size=0, opt_level=0,
                                                 use_gpu=False)
            task["onnx"] = str(base) + "-optimized.onnx"
            optimized.save_model_to_file(task["onnx"])
            task["recorded"] = {"fused": {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}}
    elif variant.startswith("openvino-"):
        task["xml"] = _openvino(model, inputs, str(base) + ".xml")
    elif variant.startswith("executorch-"):
        task["pte"] = _executorch(model, inputs, kind, variant.endswith("int8"), str(base) + ".pte")
    elif variant not in ("torch-eager", "torch-compile"):
        raise ValueError("unknown variant {!r}".format(variant))
    return task


def _openvino(model: Any, inputs: tuple, path: str) -> str:
    """The model as an OpenVINO user converts it (`openvino.convert_model` from the torch module, as OpenVINO's
    PyTorch guide shows), saved as an IR; the ONNX route when that conversion fails."""
    import copy

    import openvino
    import torch

    try:
        with torch.no_grad():
            # A copy: a failed conversion leaves what it traced on the module (ultralytics' Detect caches anchors
            # and strides as it runs), and torch.export then refuses the module on the ONNX route.
            converted = openvino.convert_model(copy.deepcopy(model), example_input=inputs)
    except Exception:  # the ONNX route a user falls back to
        onnx_path = path[:-len(".xml")] + ".onnx"
        with torch.no_grad():
            torch.onnx.export(copy.deepcopy(model), inputs, onnx_path, dynamo=True, verbose=False)
        converted = openvino.convert_model(onnx_path)
    openvino.save_model(converted, path)  # weights compressed to fp16, as the default save does
    return path


def _executorch(model: Any, inputs: tuple, kind: str, int8: bool, path: str) -> str:
    """An ExecuTorch program lowered to XNNPACK; int8 through PT2E (static per-channel for CNNs, dynamic for
    encoders, as XNNPACK recommends)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = torch.export.export(model, inputs, strict=False)
    if int8:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer, get_symmetric_quantization_config)
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True, is_dynamic=kind == "encoder"))
        prepared = _integer_constants_restored(prepare_pt2e(program.module(), quantizer))
        for sample in _random_samples(inputs, 16, 1):
            prepared(*[torch.from_numpy(a) for a in sample])
        program = torch.export.export(convert_pt2e(prepared), inputs, strict=False)
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    Path(path).write_bytes(lowered.buffer)
    return path


def _integer_constants_restored(prepared: Any) -> Any:
    """`prepared` with the scalar constants that torchao's prepare_pt2e lifted into float tensors given back the
    integer dtype of the tensor they are added to.

    Note: prepare_pt2e turns a graph's Python scalars into `_tensor_constant_N` attributes, as float tensors, even
    where the scalar was added to an integer tensor: GPT-2's and RoBERTa's position ids (`arange(16) + 0`) then
    become floats, and their embedding lookup fails during calibration (`Expected tensor for argument #1 'indices'
    to have one of the following scalar types: Long, Int`), whatever the quantizer annotates (torchao with
    ExecuTorch 1.5, 2026-12-01). The ExecuTorch int8 peer of those models needs them back as integers."""
    import torch

    for node in prepared.graph.nodes:
        if node.op != "get_attr" or not str(node.target).startswith("_tensor_constant"):
            continue
        value = getattr(prepared, node.target)
        for user in node.users:
            others = [a for a in user.args if isinstance(a, torch.fx.Node) and a is not node]
            dtypes = {o.meta["val"].dtype for o in others if isinstance(o.meta.get("val"), torch.Tensor)}
            integral = value.is_floating_point() and bool(torch.equal(value, torch.round(value)))
            if integral and len(dtypes) == 1 and not next(iter(dtypes)).is_floating_point:
                setattr(prepared, node.target, value.to(next(iter(dtypes))))
    return prepared


# --- the worker: one variant, one process ---

def build_call(task: Dict[str, Any], threads: int) -> Tuple[Callable[[], Any], Callable[[], List[Any]]]:
    """(a no-argument call running one inference, a function returning the outputs on fresh inputs as numpy)."""
    import numpy as np

    variant = task["variant"]
    inputs = [np.load(task["inputs"])["arg{}".format(i)] for i in range(task["arity"])]
    if variant.startswith("edgedyn-"):
        import edgedyn.runtime as rt

        # Every core is the runtime's default: load as a user would, so a thread count that `auto` recorded for
        # the artifact (one thread, where it measured that faster: docs/backends.md) is what runs.
        program = rt.load(task["bundle"], threads=None if threads == os.cpu_count() else threads)
        return (lambda: program(*inputs)), (lambda: _as_list(program(*inputs)))
    if variant.startswith("openvino-"):
        import openvino

        core = openvino.Core()
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}  # type: Dict[str, Any]
        if variant == "openvino-f32":
            config["INFERENCE_PRECISION_HINT"] = "f32"
        request = core.compile_model(core.read_model(task["xml"]), "CPU", config).create_infer_request()
        return (lambda: request.infer(inputs)), (lambda: [np.array(v) for v in request.infer(inputs).values()])
    if variant.startswith("onnxruntime-"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(task["onnx"], options, providers=["CPUExecutionProvider"])
        feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
        return (lambda: session.run(None, feed)), (lambda: session.run(None, feed))
    import torch

    torch.set_num_threads(threads)
    tensors = [torch.from_numpy(a) for a in inputs]
    if variant.startswith("executorch-"):
        from executorch.runtime import Runtime

        method = Runtime.get().load_program(task["pte"]).load_method("forward")
        return (lambda: method.execute(tensors)), (lambda: [t.numpy() for t in method.execute(tensors)])
    model = build_model(task["model"])[0]
    if variant == "torch-compile":
        model = torch.compile(model, backend="inductor")

    def call() -> Any:
        with torch.inference_mode():
            return model(*tensors)

    return call, lambda: [t.numpy() for t in _as_list(call())]


def _as_list(value: Any) -> List[Any]:
    """Outputs as a list: tuples, lists, a lone tensor, a `transformers` ModelOutput (zoo models) or the runtime's
    dict of named outputs (a bundle whose outputs have names)."""
    if hasattr(value, "to_tuple"):
        return list(value.to_tuple())
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, (list, tuple)) else [value]


def worker(task_path: str) -> None:
    task = json.loads(Path(task_path).read_text())
    result = {}  # type: Dict[str, Any]
    try:
        call, outputs = build_call(task, task["threads"])
        for _ in range(5):
            call()
        if task.get("calls") is not None:  # instructions.py: exactly this many calls, counted from outside
            for _ in range(task["calls"]):
                call()
            print("RESULT " + json.dumps({"calls": task["calls"]}))
            return
        result = timed_calls(call, task["seconds"])
        if task.get("reference"):
            import numpy as np

            got = np.asarray(outputs()[0], np.float64).ravel()
            want = np.load(task["reference"])["out0"].astype(np.float64).ravel()
            result["cosine"] = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want) or 1.0))
    except Exception as error:  # a variant that fails is reported, the run goes on
        result = failure(error)
    print("RESULT " + json.dumps(result))


def timed_calls(call: Callable[[], Any], seconds: float) -> Dict[str, Any]:
    """{"median_ms", "calls"} of `call` made for `seconds` (at least 10 calls), after the caller's warm-up."""
    times = []  # type: List[float]
    deadline = time.perf_counter() + seconds
    while len(times) < 10 or time.perf_counter() < deadline:
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000.0)
    return {"median_ms": statistics.median(times), "calls": len(times)}


def failure(error: BaseException) -> Dict[str, Any]:
    """A failed variant's record: its first line for the table, and for the JSON the whole message (an export's
    refusal lists every candidate it measured on the lines after the first; an EdgedynError's ends with its hint)."""
    text = str(error).strip()
    record = {"error": "{}: {}".format(type(error).__name__, (text.splitlines() or [""])[0])}
    if "\n" in text:
        record["message"] = text
    return record


def run_worker(task: Dict[str, Any], workdir: Path, script: str = __file__, timeout: int = 600,
               **env_vars: str) -> Dict[str, Any]:
    """Runs `script --worker TASK.json` in a fresh process (detection.py's workers too) and reads its RESULT line."""
    path = workdir / "task.json"
    path.write_text(json.dumps(task))
    env = dict(os.environ, PYTHONPATH=str(REPO), **env_vars)
    done = subprocess.run([sys.executable, str(Path(script).resolve()), "--worker", str(path)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        return {"error": "worker exited {}: {}".format(done.returncode, done.stderr.strip().splitlines()[-1:])}
    return json.loads(line[len("RESULT "):])


# --- the run ---

def cpu_features() -> List[str]:
    """The vector extensions that decide which kernels run (int8 above all: VNNI or not)."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "avx512_fp16",
              "amx_int8", "asimdhp", "asimddp", "i8mm")
    try:
        flags = set(next(line for line in open("/proc/cpuinfo") if line.startswith(("flags", "Features")))
                    .split(":", 1)[1].split())
    except (OSError, StopIteration):
        return []
    return [flag for flag in wanted if flag in flags]


def cpu_model() -> str:
    """The CPU's name as `edgedyn bench` reports it (edgedyn/runtime/sysinfo.py reads /proc/cpuinfo)."""
    from edgedyn.runtime import sysinfo

    return sysinfo.environment().get("cpu_model") or platform.machine()


def fresh_inputs(name: str, workdir: Path) -> Tuple[str, Dict[str, Any]]:
    """(the model's kind, the task fields every worker of it reads: fresh inputs, and torch eager's output on them)."""
    import numpy as np
    import torch

    model, inputs, kind = build_model(name)
    fresh = list(_random_samples(inputs, 1, 99)[0])
    with torch.no_grad():
        reference = _as_list(model(*[torch.from_numpy(a) for a in fresh]))[0].numpy()
    np.savez(str(workdir / "inputs.npz"), **{"arg{}".format(i): a for i, a in enumerate(fresh)})
    np.savez(str(workdir / "reference.npz"), out0=reference)
    return kind, {"inputs": str(workdir / "inputs.npz"), "arity": len(fresh),
                  "reference": str(workdir / "reference.npz")}


def bench_model(name: str, args: argparse.Namespace, workdir: Path) -> Dict[str, Any]:
    kind, common = fresh_inputs(name, workdir)
    tasks, record = {}, {"kind": kind, "variants": {}}  # type: Dict[str, Dict[str, Any]], Dict[str, Any]
    for variant in variants_for(kind, args.variants):
        print("[{}] building {}".format(name, variant), file=sys.stderr, flush=True)
        try:
            tasks[variant] = dict(prepare(variant, name, workdir, args), threads=args.threads, seconds=args.seconds,
                                  **common)
        except Exception as error:
            record["variants"][variant] = failure(error)
            if os.environ.get("EDGEDYN_DEBUG"):
                traceback.print_exc()
    rounds = {variant: [] for variant in tasks}  # type: Dict[str, List[Dict[str, Any]]]
    order = list(tasks)
    for index in range(args.rounds):
        rotated = order[index % len(order):] + order[:index % len(order)] if order else []
        for variant in rotated:
            if variant == "torch-compile" and index >= args.compile_rounds:
                continue  # each worker compiles again: minutes on a small machine
            rounds[variant].append(run_worker(tasks[variant], workdir))
            print("[{}] round {} {}: {}".format(name, index + 1, variant, rounds[variant][-1]), file=sys.stderr,
                  flush=True)
    for variant, results in rounds.items():
        times = [r["median_ms"] for r in results if "median_ms" in r]
        entry = {"rounds_ms": [round(t, 4) for t in times], "recorded": tasks[variant].get("recorded")}
        if times:
            entry["median_ms"] = statistics.median(times)
            entry["cosine"] = next((r["cosine"] for r in results if "cosine" in r), None)
        failed = [r for r in results if "error" in r]
        if failed:
            entry.update({key: failed[0][key] for key in ("error", "message") if key in failed[0]})
        record["variants"][variant] = entry
    add_speedups(record)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names, or zoo:NAME")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per worker")
    parser.add_argument("--edgedyn-backend", default="auto")
    parser.add_argument("--compile-rounds", type=int, default=1, help="rounds for torch-compile (it compiles anew "
                        "in each worker)")
    parser.add_argument("--summarize", metavar="RESULTS.json", nargs="+", help="print the tables of an earlier run, "
                        "measure nothing; several files are read as one run (a stopped run and its rest)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.summarize:
        try:
            runs = joined([json.loads(Path(path).read_text()) for path in args.summarize])
        except (OSError, ValueError) as error:
            parser.error(str(error))
        print("{} ({} threads, median of {} rounds; started {})".format(runs["cpu"], runs["threads"], runs["rounds"],
                                                                       runs["created"]))
        print(summary(runs))
        return
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error("unknown variant(s) {}; choose from: {}".format(", ".join(unknown), ", ".join(VARIANTS)))
    import onnxruntime
    import torch

    results = dict(run_header(args.threads, args.rounds),
                   **{"seconds_per_worker": args.seconds, "edgedyn_backend": args.edgedyn_backend,
                      "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
                                   "python": platform.python_version()},
                      "models": {}})  # type: Dict[str, Any]
    from importlib.metadata import PackageNotFoundError, version

    for package in ("executorch", "openvino"):
        try:
            results["versions"][package] = version(package)
        except PackageNotFoundError:
            pass
    out = results_path("speed")
    for name in [m for m in args.models.split(",") if m]:
        with tempfile.TemporaryDirectory(prefix="edgedyn-speed-") as workdir:
            results["models"][name] = bench_model(name, args, Path(workdir))
        results["load_average"] = os.getloadavg()  # after each model: how busy the machine was while it ran
        out.write_text(json.dumps(results, indent=2, sort_keys=True))  # after each model: a long run keeps its part
    print_run(results, summary(results), out)


def run_header(threads: int, rounds: int) -> Dict[str, Any]:
    """What every timing benchmark's JSON starts with: when, on which CPU (model, flags, cores), how, how busy."""
    return {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpu": cpu_model(), "cpu_features": cpu_features(), "cores": os.cpu_count(), "threads": threads,
            "rounds": rounds, "load_average_at_start": os.getloadavg()}


def results_path(kind: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / "{}-{}.json".format(kind, datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


def print_run(results: Dict[str, Any], text: str, out: Path) -> None:
    """The run's CPU line, its table, and where its JSON is."""
    print("{} [{}] ({} threads, median of {} rounds, each variant in its own process; load average {:.2f})".format(
        results["cpu"], " ".join(results["cpu_features"]), results["threads"], results["rounds"], os.getloadavg()[0]))
    print(text)
    print("results: {}".format(out.relative_to(REPO)))


if __name__ == "__main__":
    main()
