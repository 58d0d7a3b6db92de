"""A loaded bundle as a callable: bind arguments, check guards, dispatch to a specialization, run its executor."""
import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.runtime import guards as guard_checks
from edgedyn.runtime import schema
from edgedyn.runtime.buckets import BucketDispatch, Finish, arena_pools, load_order
from edgedyn.runtime.detections import compare_outputs
from edgedyn.runtime.choice import artifact_label, unusable_reason
from edgedyn.runtime.errors import (BundleError, EdgedynError, ExecutionError, GuardError, MissingDependencyError,
                                    PlatformError)
from edgedyn.runtime.executors import executor_class
from edgedyn.runtime.fastpath import FastDispatch, call_key
from edgedyn.runtime.format import Bundle, PathLike, host_arch
from edgedyn.runtime.frames import frames_of
from edgedyn.runtime.outputs import build_outputs, flatten_outputs  # noqa: F401 (flatten_outputs: re-exported)
from edgedyn.runtime.precision import FP32, REDUCED

log = logging.getLogger("edgedyn.runtime")
DEVICES = ("auto", "cpu", "gpu")
# An fp32 artifact's tolerance against torch eager when its manifest entry names none: max |got - want| <= atol +
# rtol * max |want|. Backends write it into each artifact (edgedyn/backends/); int8 ones write their own.
FP32_TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}
EXPECTED_ROLE = "expected"  # an int8 artifact's own outputs on the reference inputs, which `verify` compares with
# The cosine a reduced-precision artifact (float, or int8 with reduced float layers) keeps to torch eager when its
# record names no gate: the float and the int8 gates' defaults (quantize/precision.py, quantize/accuracy.py).
DEFAULT_MIN_COSINE, DEFAULT_INT8_COSINE = 0.999, 0.99


class Specialization:
    """One captured set of shapes and constants, with the artifact that runs it here."""

    def __init__(self, record: Dict[str, Any]) -> None:
        self.record = record
        self.name = record["name"]  # type: str
        self.guards = record["guards"]  # type: List[Dict[str, Any]]
        self.inputs = [item["name"] for item in record["inputs"]]  # type: List[str]
        self.outputs = record["outputs"]  # type: List[Dict[str, Any]]
        self.output_tree = record["output_tree"]  # type: Dict[str, Any]
        self.artifact = None  # type: Optional[Dict[str, Any]]
        self.executor = None  # type: Any
        self.skipped = []  # type: List[Tuple[str, str]]

    def selection(self) -> str:
        """Which artifact runs this specialization here, in which precision, and why earlier ones do not, in words."""
        assert self.artifact is not None
        text = "{}: {} on {}".format(self.name, artifact_label(self.artifact), host_arch())
        computes, why_not = self.precision()
        if computes != FP32 or why_not:
            text += " in {}".format(computes) + (" ({})".format(why_not) if why_not else "")
        if self.skipped:
            text += " ({})".format("; ".join("{} not used: {}".format(l, r) for l, r in self.skipped))
        return text

    def precision(self) -> Tuple[str, Optional[str]]:
        """(the precision this specialization computes in here, why it is not the artifact's or None)."""
        assert self.artifact is not None
        told = getattr(self.executor, "precision", None)
        if callable(told):
            return told()
        return str(self.artifact.get("precision", FP32)), None


class Program:
    """The callable a bundle becomes on the board: `program(x, n=4)` returns numpy arrays."""

    def __init__(self, bundle: Bundle, threads: Optional[int] = None, device: str = "auto",
                 fallbacks: bool = False) -> None:
        if device not in DEVICES:
            raise EdgedynError("unknown device '{}'; choose from: {}".format(device, ", ".join(DEVICES)))
        check_threads(threads)
        started = time.perf_counter()
        self.bundle, self._fallbacks = bundle, fallbacks
        self.manifest = bundle.manifest
        self.signature = self.manifest["signature"]  # type: List[Dict[str, Any]]
        self.specializations = [Specialization(record) for record in self.manifest["specializations"]]
        pools = arena_pools(self.manifest)
        for spec in load_order(self.specializations) if pools else self.specializations:
            self._choose_artifact(spec, device, threads, pools.get(id(spec.record)))
            # A bundle with GPU code that runs on the CPU here deserves a warning, unless the user asked for the CPU.
            has_gpu_code = any(a.get("device", "cpu") != "cpu" for a in spec.record["artifacts"])
            fell_back = has_gpu_code and spec.artifact.get("device", "cpu") == "cpu" and device != "cpu"
            fell_back = fell_back or spec.precision()[1] is not None  # a reduced precision this CPU cannot compute
            log.log(logging.WARNING if fell_back else logging.INFO, "edgedyn: %s", spec.selection())
        self._fast = FastDispatch(self.signature, self.specializations)
        self.buckets = BucketDispatch(self.manifest.get("buckets", []), self.specializations,
                                      [param["name"] for param in self.signature])
        self.frames = frames_of(self.manifest)  # `export --preprocess`: frames in, detections on the frame out
        self.init_ms = (time.perf_counter() - started) * 1000.0

    def _choose_artifact(self, spec: Specialization, device: str, threads: Optional[int], pool: Any) -> None:
        """The first artifact (GPU ones come first) that this machine can run; the reasons for the others."""
        arch = host_arch()
        artifacts = spec.record["artifacts"]
        for index, artifact in enumerate(artifacts):
            reason = unusable_reason(artifact, arch, device, index == len(artifacts) - 1, self._fallbacks)
            if reason is None:
                try:
                    spec.executor = self._open(spec, artifact, threads, pool)
                    spec.artifact = artifact
                    return
                except (MissingDependencyError, ArtifactLoadError) as error:
                    if index == len(artifacts) - 1:
                        raise
                    reason = error.message.splitlines()[0]
            spec.skipped.append((artifact_label(artifact), reason))
        if all(a.get("arch") not in (None, arch) for a in artifacts):
            raise _wrong_platform(self.bundle, spec, arch)
        raise PlatformError(
            "no artifact of specialization {} can run here: {}".format(
                spec.name, "; ".join("{}: {}".format(label, reason) for label, reason in spec.skipped)),
            hint="use --device auto, or export again for this machine",
        )

    def _open(self, spec: Specialization, artifact: Dict[str, Any], threads: Optional[int], pool: Any) -> Any:
        """The artifact's executor. Whatever its runtime raises on the artifact's bytes (a protobuf, flatbuffer or
        TVM error) becomes an ArtifactLoadError naming the members, so the next artifact may be tried."""
        opener = executor_class(artifact["executor"])
        try:
            # the caller's thread count, else the one `auto` measured faster for this artifact, else the default
            chosen = threads if threads is not None else artifact.get("threads")
            return opener(self.bundle, artifact, {"threads": chosen, "arena_pool": pool,
                                                  "declared_bytes": schema.declared_tensor_bytes(spec.record)})
        except EdgedynError:
            raise
        except Exception as error:
            raise ArtifactLoadError(
                "bundle {}: {} of specialization {} (members {}) does not load: {}: {}".format(
                    self.bundle.path.name, artifact_label(artifact), schema.short(spec.name),
                    schema.bounded(sorted(artifact["files"].values())), type(error).__name__,
                    schema.short(str(error), 300)),
                hint="copy the bundle again or export it again; never edit a bundle by hand")

    @property
    def name(self) -> str:
        return self.manifest["model"]["name"]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the matching specialization; safe to call from any number of threads at once (see threads.py)."""
        return self.run_routed(*self.route_call(args, kwargs))[1]

    def run_routed(self, spec: Specialization, arrays: List[np.ndarray], finish: Optional[Finish]) -> Tuple[Any, Any]:
        """(spec, outputs) for route_call's three values: a caller that names the specialization routes once."""
        try:
            outputs = spec.executor.run(arrays)
            return spec, build_outputs(spec.output_tree, finish(outputs) if finish is not None else outputs)
        except EdgedynError:
            raise
        except Exception as error:  # the arguments passed every guard: the artifact itself is at fault
            raise ExecutionError(
                "{} ({}) failed on arguments that match its guards: {}: {}".format(
                    schema.short(spec.name), artifact_label(spec.artifact), type(error).__name__,
                    schema.short(str(error), 300)),
                hint="run `edgedyn verify` on the bundle; export it again if it fails")

    def route(self, *args: Any, **kwargs: Any) -> Tuple[Specialization, List[np.ndarray]]:
        """A call's specialization and executor input arrays (padded to a bucket; GuardError when none matches)."""
        return self.route_call(args, kwargs)[:2]

    def route_call(self, args: Sequence[Any], kwargs: Dict[str, Any]
                   ) -> Tuple[Specialization, List[np.ndarray], Optional[Finish]]:
        """route(), and how to cut the outputs back (None unless padded). Exact positional arrays take the fast rules
        (fastpath.py), shapes padded before the buckets' (buckets.py); anything else is bound and guard-checked.
        A frame given to a bundle exported with --preprocess becomes the model's input first (frames.py)."""
        if self.frames is not None:
            args, kwargs, placement = self.frames.take(args, kwargs)
            if placement is not None:
                return self.frames.routed(self.route_call(args, kwargs), placement)
        key = call_key(args) if not kwargs else None  # one key for the exact fast path and the padded one
        if key is not None:
            routed = self._fast.match_key(key, args) or self.buckets.seen(key, args)
        else:
            routed = self.buckets.fast(args, kwargs) if kwargs else None
        if routed is not None:
            return routed
        spec, values, padded = self._dispatch(self.bind(args, kwargs))
        if padded is not None:
            return padded
        return spec, [np.asarray(values[name], order="C") for name in spec.inputs], None

    def dispatch(self, *args: Any, **kwargs: Any) -> Tuple[Specialization, Dict[str, Any]]:
        """The specialization whose guards hold (or a padded call's bucket), and the bound values (a frame made input)."""
        if self.frames is not None:
            args, kwargs, _ = self.frames.take(args, kwargs)
        return self._dispatch(self.bind(args, kwargs))[:2]

    def _dispatch(self, values: Dict[str, Any]) -> Tuple[Specialization, Dict[str, Any], Optional[Any]]:
        failures = []
        for spec in self.specializations:
            failure = guard_checks.first_failure(spec.guards, values)
            if failure is None:
                return spec, values, None
            failures.append((spec.name, failure))
        padded = self.buckets.route(values)
        if padded is not None:
            return padded[0], values, padded
        hint = self.buckets.hint(values) or guard_checks.no_match_hint(
            self.signature, [s.guards for s in self.specializations], values)
        raise GuardError(_no_match_message(self.name, failures), hint=hint)

    def bind(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """Maps positional and keyword arguments to the captured signature, as Python would."""
        names = [param["name"] for param in self.signature]
        if len(args) > len(names):
            raise GuardError("{} takes {} argument(s) ({}), got {}".format(
                self.name, len(names), ", ".join(names), len(args)))
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise GuardError("{} got an unexpected argument '{}'; its arguments are: {}".format(
                    self.name, key, ", ".join(names)))
            if key in values:
                raise GuardError("{} got argument '{}' twice (positionally and by name)".format(self.name, key))
            values[key] = value
        for param in self.signature:
            name = param["name"]
            if name not in values:
                if "default" not in param:
                    raise GuardError("{} is missing argument '{}'".format(self.name, name))
                values[name] = param["default"]
            elif param["kind"] == "tensor" and not isinstance(values[name], np.ndarray) and (
                    hasattr(values[name], "__array__") or isinstance(values[name], (list, tuple))):
                values[name] = np.asarray(values[name])
        return values

    def reference(self, spec: Specialization) -> Tuple[Dict[str, Any], List[np.ndarray]]:
        """The reference arguments stored at export time and torch eager's outputs for them."""
        arrays = self.bundle.arrays(spec.record["reference"])
        values = dict(spec.record["constants"])
        wanted = ["input." + name for name in spec.inputs] + ["output.{}".format(i) for i in range(len(spec.outputs))]
        _require_arrays(arrays, wanted, spec.record["reference"])
        values.update({name: arrays["input." + name] for name in spec.inputs})
        return values, [arrays["output.{}".format(i)] for i in range(len(spec.outputs))]

    def verify(self) -> List[Dict[str, Any]]:
        """Runs every specialization on its reference inputs and compares with torch eager's outputs; then the
        padded calls proven at export (runtime/buckets.py), against torch eager on the unpadded call."""
        results, calls = [], [(spec.name, spec) + self.reference(spec) for spec in self.specializations]
        for label, spec, values, expected in calls + self.buckets.references(self.bundle, self.reference):
            padded = label != spec.name
            chosen, _ = self.dispatch(**values)
            if chosen is not spec:
                raise EdgedynError("reference inputs of '{}' dispatched to '{}'; the bundle's guards overlap".format(
                    label, chosen.name))
            int8 = EXPECTED_ROLE in spec.artifact["files"]  # int8 differs from torch eager by design:
            if padded and int8:
                continue  # its own outputs are checked at the bucket
            actual = flatten_outputs(spec.output_tree, self(**values))
            tolerance = spec.artifact.get("tolerance", FP32_TOLERANCE)
            extra = {"against": "torch eager on the unpadded call"} if padded else {}  # type: Dict[str, Any]
            min_cosine = reduced_gate(spec.artifact)
            if int8 and min_cosine is None:  # its own outputs recorded at export (quantize/accuracy.py)
                names, member = ["output.{}".format(i) for i in range(len(spec.outputs))], spec.artifact["files"]
                recorded = self.bundle.arrays(member[EXPECTED_ROLE])
                _require_arrays(recorded, names, member[EXPECTED_ROLE])
                expected = [recorded[name] for name in names]
                extra["against"] = "int8 outputs recorded at export"
            if min_cosine is not None:
                extra["precision"] = spec.precision()[0]
                if int8:  # its float layers reduced: CPUs differ in them
                    extra["against"] = "torch eager, at the int8 gate"
                compared = [compare_cosine(got, want, min_cosine) for got, want in zip(actual, expected)]
            else:
                compared = compare_outputs([r["name"] for r in spec.outputs], actual, expected, tolerance, compare,
                                           spec.record.get("detections"))
            for record, result in zip(spec.outputs, compared):
                results.append(dict(result, specialization=label, output=record["name"],
                                    artifact=spec.artifact["backend"], **extra))
        return results


def check_threads(threads: Any) -> None:
    """None (the backend's default) or a whole number of threads, 1 or more."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise EdgedynError("the thread count must be 1 or more, got {}".format(schema.short(threads)),
                           hint="pass --threads N (threads=N) with N >= 1, or leave it out for the backend's default")


class ArtifactLoadError(BundleError):
    """An artifact's own runtime refused its bytes; the next artifact of the specialization may still run."""


def _require_arrays(arrays: Dict[str, np.ndarray], names: List[str], member: str) -> None:
    missing = [name for name in names if name not in arrays]
    if missing:
        raise BundleError("bundle member {} lacks arrays {}".format(member, schema.bounded(missing)),
                          hint="copy the bundle again or export it again; never edit a bundle by hand")


def compare(got: np.ndarray, want: np.ndarray, tolerance: Dict[str, float]) -> Dict[str, Any]:
    """Max abs error, and max abs error relative to the largest reference magnitude; passes within tolerance."""
    if got.shape != want.shape:
        return {"ok": False, "max_abs": float("inf"), "max_rel": float("inf"),
                "error": "shape {} != expected {}".format(got.shape, want.shape)}
    if want.size == 0:
        return {"ok": True, "max_abs": 0.0, "max_rel": 0.0}
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    max_abs = float(np.max(diff))
    scale = float(np.max(np.abs(want.astype(np.float64))))
    max_rel = max_abs / scale if scale > 0 else max_abs
    ok = bool(np.all(np.isfinite(got) == np.isfinite(want))) and max_abs <= tolerance["atol"] + tolerance["rtol"] * scale
    return {"ok": ok, "max_abs": max_abs, "max_rel": max_rel, "rtol": tolerance["rtol"], "atol": tolerance["atol"]}


def reduced_gate(artifact: Dict[str, Any]) -> Optional[float]:
    """The cosine a reduced-precision (bf16, fp16) CPU artifact keeps to torch eager: the gate it met (its `accuracy`,
    an int8 one's `quantization.accuracy`: its float layers compute in that precision); None for fp32, GPU and
    int8-with-fp32 artifacts. How far it moves depends on the CPU (fp32 without the feature; OpenVINO on Arm runs some
    int8 convolutions in fp16): `verify` holds it to its gate, not to fp32's tolerance or one CPU's recorded outputs."""
    if artifact.get("precision") not in REDUCED or artifact.get("device", "cpu") != "cpu":
        return None
    int8 = isinstance(artifact.get("quantization"), dict)
    record = artifact["quantization"] if int8 else artifact
    gate = record.get("accuracy", {}).get("gate", {}) if isinstance(record.get("accuracy"), dict) else {}
    value = gate.get("min_cosine") if isinstance(gate, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return DEFAULT_INT8_COSINE if int8 else DEFAULT_MIN_COSINE


def compare_cosine(got: np.ndarray, want: np.ndarray, min_cosine: float) -> Dict[str, Any]:
    """`compare`'s record for a reduced-precision output: passes when its cosine to `want` is at least
    `min_cosine` and it is finite where `want` is."""
    result = compare(got, want, {"rtol": float("inf"), "atol": float("inf")})
    if "error" in result:
        return result
    a, b = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    cosine = float(a @ b / norms) if norms > 0 else (1.0 if not np.any(a) and not np.any(b) else 0.0)
    ok = bool(np.all(np.isfinite(got) == np.isfinite(want))) and cosine >= min_cosine
    return dict(result, ok=ok, cosine=cosine, min_cosine=min_cosine, rtol=None, atol=None)


def _no_match_message(model: str, failures: List[Tuple[str, str]]) -> str:
    lines = ["no specialization of {} matches these arguments:".format(model)]
    for name, failure in failures[:schema.LISTED]:
        lines.append("  {}: {}".format(schema.short(name), failure))
    if len(failures) > schema.LISTED:
        lines.append("  and {} more".format(len(failures) - schema.LISTED))
    return "\n".join(lines)


def _wrong_platform(bundle: Bundle, spec: Specialization, arch: str) -> PlatformError:
    built = sorted({str(a.get("arch")) for a in spec.record["artifacts"]})
    board = bundle.manifest["board"]
    hint = "run it on a {} board, or export again for this machine with --board {}".format(
        board.get("name"), "x86-64" if arch == "x86_64" else "<your board>")
    if arch == "x86_64" and "aarch64" in built:  # the host tools emulate aarch64 boards (edgedyn/emulate)
        hint += "; to check it here, on the board emulated under qemu: edgedyn verify {} --emulate".format(
            bundle.path.name)
    return PlatformError(
        "bundle {} was built for {} (board {}), but this machine is {}".format(
            bundle.path.name, "/".join(built), board.get("name"), arch),
        hint=hint,
    )


def load(path: PathLike, threads: Optional[int] = None, device: str = "auto",
         trusted_keys: Optional[Sequence[Any]] = None, fallbacks: bool = False) -> Program:
    """Opens a bundle, checks format, checksums and CPU architecture, and returns the callable program.

    `device`: "auto" runs GPU artifacts when this machine can (driver, GPU and executor present) and the CPU
    artifact otherwise; "cpu" or "gpu" forces the choice. Each specialization's choice is logged and kept in
    `program.specializations[i].selection()`.
    `trusted_keys`: public key files (or raw keys); when given, or when EDGEDYN_TRUSTED_KEYS names any, a bundle
    that is not signed by one of them is refused before any member is parsed or any library loaded.
    `fallbacks`: run each specialization's fp32 fallback where it carries one (runtime/choice.py), even on a CPU
    that computes the reduced precision before it: `edgedyn verify` checks both so.
    """
    return Program(Bundle(path, trusted_keys=trusted_keys), threads=threads, device=device, fallbacks=fallbacks)
