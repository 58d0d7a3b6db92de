"""Capture: trace a model or function with torch.export at the exact example shapes, and record the guards.

Python control flow is unrolled and Python scalars are specialized; every assumption this makes (each input's
dtype and sizes, each scalar's value) becomes a guard that the runtime checks on every call.
"""
import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from edgedyn.errors import CaptureError
from edgedyn.frontend.buckets import BucketGroup, expand_buckets
from edgedyn.frontend.inputs import InputSet, TensorSpec, normalize_examples, parse_input_options
from edgedyn.frontend.loading import load_reference, resolve_model
from edgedyn.frontend.nms import noting_detections
from edgedyn.frontend.outputs import flatten_output, output_names
from edgedyn.frontend.source import describe, failure_frames
from edgedyn.frontend.torchvision_detection import fixed_shape_postprocessing
from edgedyn.runtime import guards as guard_records
from edgedyn.torch_quiet import quiet_torch

__all__ = ["Captured", "Specialization", "capture", "parse_input_options"]


@dataclass
class Specialization:
    """One set of example inputs, traced: the ExportedProgram plus what the bundle records about it."""

    name: str
    program: "torch.export.ExportedProgram"
    tensor_inputs: List[str]
    example_tensors: List[torch.Tensor]
    constants: Dict[str, Any]
    guards: List[Dict[str, Any]]
    output_tree: Dict[str, Any]
    reference_outputs: List[np.ndarray]
    # What each detection output (boxes, scores, labels, count) kept: its score threshold and row count, noted by
    # the post-processing that made it (edgedyn/frontend/nms.py); empty for other models.
    detections: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def example_args(self) -> Tuple[torch.Tensor, ...]:
        return tuple(self.example_tensors)

    @property
    def output_names(self) -> List[str]:
        """The flat outputs' names: a dict's or ModelOutput's keys (`logits`), else `output_0`, `output_1`..."""
        return output_names(self.output_tree)


@dataclass
class Captured:
    """A captured model: its call signature and one Specialization per example input set."""

    name: str
    signature: List[Dict[str, Any]]
    specializations: List[Specialization] = field(default_factory=list)
    buckets: List[BucketGroup] = field(default_factory=list)  # specializations made from --input sizes in braces
    model: Any = field(default=None, repr=False)  # the eager model, for the padding proof (frontend/padding.py)
    order: List[str] = field(default_factory=list)  # its positional parameters, as _call binds them


def capture(model: Any, example_inputs: Any = None, *, inputs: Optional[Sequence[str]] = None,
            seed: int = 0, nms: Any = None) -> Captured:
    """Captures `model` (nn.Module, class, factory, function, or "file.py:name") at each example input set.

    `example_inputs` is a tuple or dict of inputs (one specialization) or a list of them (several); `inputs`
    are `--input NAME=VALUE` strings instead. With neither, the model file's `example_inputs()` is used.
    `nms` (an NmsOptions or its `--nms` text) appends NMS to a raw detection head (edgedyn/frontend/detection.py).
    """
    name = getattr(model, "__name__", type(model).__name__)
    if isinstance(model, str):
        model, file_examples, name = load_reference(model)
        if example_inputs is None and not inputs:
            if file_examples is None:
                raise CaptureError(
                    "no example inputs for {}".format(name),
                    hint="pass --input NAME=SHAPE (e.g. --input x=1x3x224x224) or define example_inputs() in the model file",
                )
            example_inputs = file_examples()
    else:
        model = resolve_model(model, name)
    if isinstance(model, torch.nn.Module):
        _eval(model)
        name = type(model).__name__ if name in ("", type(model).__name__) else name
    if nms is not None:
        from edgedyn.frontend.detection import NmsOptions, parse_nms, with_nms

        model = with_nms(model, nms if isinstance(nms, NmsOptions) else parse_nms(nms))
    parameters = _parameters(model, name)
    groups = []  # type: List[BucketGroup]
    if inputs:
        sets, groups = expand_buckets([dict(s) for s in parse_input_options(inputs)])
        sources = ["--input"] * len(sets)
    elif example_inputs is not None:
        sets = [_bind(parameters, item, name) for item in normalize_examples(example_inputs)]
        sources = ["example_inputs"] * len(sets)
    else:
        raise CaptureError("no example inputs for {}".format(name),
                           hint="pass example_inputs=(tensor, ...) or inputs=['x=1x3x224x224']")
    captured = Captured(name=name, signature=_signature(parameters, sets, name), buckets=groups, model=model,
                        order=[p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])
    with fixed_shape_postprocessing(model):
        for index, (values, source) in enumerate(zip(sets, sources)):
            spec = _capture_one(model, parameters, values, source, seed + index, name)
            if any(existing.name == spec.name for existing in captured.specializations):
                raise CaptureError("specialization {} is given twice".format(spec.name))
            captured.specializations.append(spec)
    return captured


def _eval(model: torch.nn.Module) -> None:
    """Eval mode; a module from ExportedProgram.module() refuses eval() and keeps the mode it was exported in."""
    try:
        model.eval()
    except NotImplementedError:
        pass


def _parameters(model: Any, name: str) -> List[inspect.Parameter]:
    """The named arguments of the model's forward; `*args` and `**kwargs` are left empty, so they are not among
    them."""
    function = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as error:
        raise CaptureError("cannot read the signature of {}: {}".format(name, error))
    named = [p for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    rest = [p for p in parameters if p.kind == p.VAR_POSITIONAL]
    if rest and not named:
        raise CaptureError(
            "{} takes only *{}; edgedyn needs named arguments to guard them".format(name, rest[0].name),
            hint="wrap the model in a function with explicit arguments")
    # Note: `transformers` models take `**kwargs` (attention options passed down) and ultralytics' take
    # `forward(self, x, *args, **kwargs)`; arguments given by name are captured and guarded, every other one takes
    # its default, and *args and **kwargs receive nothing.
    return named


def _bind(parameters: List[inspect.Parameter], example: Any, name: str) -> InputSet:
    if isinstance(example, dict):
        return dict(example)
    if len(example) > len(parameters):
        raise CaptureError("{} example inputs given, but {} takes {}".format(len(example), name, len(parameters)))
    return {p.name: value for p, value in zip(parameters, example)}


def _signature(parameters: List[inspect.Parameter], sets: List[InputSet], name: str) -> List[Dict[str, Any]]:
    signature = []
    for parameter in parameters:
        given = [s[parameter.name] for s in sets if parameter.name in s]
        if not given and parameter.default is None:
            continue  # left at None (a mask, labels, a cache): not captured, so not an argument of the bundle
        is_tensor = any(isinstance(v, (TensorSpec, torch.Tensor, np.ndarray)) for v in given)
        record = {"name": parameter.name, "kind": "tensor" if is_tensor else "constant"}  # type: Dict[str, Any]
        if parameter.default is not inspect.Parameter.empty and _is_scalar(parameter.default):
            record["default"] = parameter.default
        signature.append(record)
    known = {p.name for p in parameters}
    for values in sets:
        unknown = sorted(set(values) - known)
        if unknown:
            raise CaptureError("{} has no argument named {}".format(name, ", ".join(unknown)),
                               hint="its arguments are: {}".format(", ".join(p.name for p in parameters)))
    return signature


def _is_scalar(value: Any) -> bool:
    return type(value) in (int, float, bool)


class _Specialized(torch.nn.Module):
    """Calls the user's model with the tensor inputs and the specialized constants; returns flat outputs."""

    def __init__(self, model: Any, tensor_names: List[str], constants: Dict[str, Any],
                 order: List[str]) -> None:
        super().__init__()
        if isinstance(model, torch.nn.Module):
            self.model = model
        else:
            self._function = model
            # torch.export records source lines only in frames named `forward` or registered as anchors: register
            # the user's function, so errors and op diagnostics point at its lines rather than at this wrapper.
            register = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
            if register is not None:
                register(model)
        self.tensor_names = tensor_names
        self.constants = constants
        self.order = order

    def forward(self, *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        target = self.model if hasattr(self, "model") else self._function
        kwargs = dict(zip(self.tensor_names, tensors))
        kwargs.update(self.constants)
        return tuple(flatten_output(_call(target, self.order, kwargs))[1])


def _call(target: Any, order: List[str], values: Dict[str, Any]) -> Any:
    """Calls as Python binds: the leading run of given positional parameters (`order`) positionally, the rest by
    name. A module from ExportedProgram.module() accepts its inputs only positionally."""
    positional = []
    for name in order:
        if name not in values:
            break
        positional.append(values[name])
    return target(*positional, **{k: v for k, v in values.items() if k not in order[:len(positional)]})


def _capture_one(model: Any, parameters: List[inspect.Parameter], values: InputSet, source: str, seed: int,
                 name: str) -> Specialization:
    generator = torch.Generator().manual_seed(seed)
    tensors = {}  # type: Dict[str, torch.Tensor]
    constants = {}  # type: Dict[str, Any]
    guards = []  # type: List[Dict[str, Any]]
    labels = []
    for parameter in parameters:
        if parameter.name not in values:
            if parameter.default is inspect.Parameter.empty:
                raise CaptureError("no example value for argument '{}' of {}".format(parameter.name, name),
                                   hint="add --input {}=SHAPE or {}=NUMBER".format(parameter.name, parameter.name))
            if not _is_scalar(parameter.default) and parameter.default is not None:
                raise CaptureError("argument '{}' defaults to a {}; give it an example value".format(
                    parameter.name, type(parameter.default).__name__))
            if parameter.default is not None:
                constants[parameter.name] = parameter.default
                guards.append(guard_records.constant_guard(parameter.name, parameter.default, "default value"))
            continue
        value = values[parameter.name]
        if isinstance(value, TensorSpec):
            value = _random_tensor(value, generator, parameter.name)
        elif isinstance(value, np.ndarray):
            value = torch.from_numpy(np.asarray(value, order="C"))
        if isinstance(value, torch.Tensor):
            tensors[parameter.name] = value.detach().contiguous()
            dtype = str(value.dtype).replace("torch.", "")
            label = "{}={}{}".format(parameter.name, guard_records.format_shape(value.shape),
                                     "" if dtype == "float32" else ":" + dtype)
            guards.extend(guard_records.tensor_guards(parameter.name, list(value.shape), dtype,
                                                      "{} {}".format(source, label)))
        elif _is_scalar(value):
            constants[parameter.name] = value
            label = "{}={!r}".format(parameter.name, value)
            guards.append(guard_records.constant_guard(parameter.name, value, "{} {}".format(source, label)))
        else:
            raise CaptureError(
                "argument '{}' of {} is a {}; edgedyn captures tensors and int/float/bool scalars".format(
                    parameter.name, name, type(value).__name__),
                hint="wrap the model in a function that takes tensors and builds the rest inside")
        labels.append(label)
    tensor_names = list(tensors)
    order = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    wrapper = _Specialized(model, tensor_names, constants, order)
    wrapper.training = False  # not .eval(): it would recurse into an ExportedProgram module, which refuses it
    args = tuple(tensors[n] for n in tensor_names)
    with torch.no_grad(), noting_detections() as detections:
        try:
            eager = _call(model, order, dict(tensors, **constants))
        except Exception as error:
            raise _explain_eager_failure(error, name, labels) from error
    output_tree, flat = flatten_output(eager)
    program = _export(wrapper, args, name)
    return Specialization(
        name=",".join(labels) or "default",
        program=program,
        tensor_inputs=tensor_names,
        example_tensors=list(args),
        constants=constants,
        guards=guards,
        output_tree=output_tree,
        reference_outputs=[t.detach().cpu().numpy() for t in flat],
        detections=list(detections),
    )


def _random_tensor(spec: TensorSpec, generator: torch.Generator, name: str = "") -> torch.Tensor:
    dtype = getattr(torch, spec.dtype)
    if is_mask(name, dtype) and spec.shape:
        # Note: a mask as a tokenizer pads a batch, ones then zeros over the last quarter: models derive lengths from
        # it (wav2vec2 sums it), and random ids in a mask would ask for positions that do not exist.
        valid = max(1, (3 * spec.shape[-1] + 3) // 4)
        return (torch.arange(spec.shape[-1]) < valid).expand(spec.shape).to(dtype).contiguous()
    if spec.dtype == "bool":
        return torch.randint(0, 2, spec.shape, generator=generator).bool()
    if dtype.is_floating_point:
        return torch.randn(spec.shape, generator=generator).to(dtype)
    # Small non-negative integers: safe as indices into embeddings and gathers of any size >= 10.
    return torch.randint(0, 10, spec.shape, generator=generator, dtype=dtype)


def is_mask(name: str, dtype: torch.dtype) -> bool:
    """An integer or bool input named like `attention_mask`: drawn as a mask (1 = a valid position), not as ids."""
    return "mask" in name.lower() and not dtype.is_floating_point


def _export(wrapper: torch.nn.Module, args: Tuple[torch.Tensor, ...], name: str) -> "torch.export.ExportedProgram":
    with quiet_torch():
        try:
            return torch.export.export(wrapper, args, strict=False)
        except Exception as error:
            raise _explain_export_failure(error, name) from error


_DATA_DEPENDENT = ("data-dependent", "data dependent", "GuardOnDataDependentSymNode", "Could not guard on")


def _explain_export_failure(error: Exception, name: str) -> CaptureError:
    text = "{}: {}".format(type(error).__name__, error)
    location, code = describe(error)
    if any(marker in text for marker in _DATA_DEPENDENT):
        inner, _ = failure_frames(error)
        hint = ("compute both branches and pick with torch.where(cond, a, b), or use torch.cond; Python control "
                "flow on shapes and Python numbers is fine")
        if inner is not None and inner.library is not None:
            hint = ("the branch is in {}, not in your code: edgedyn captures the post-processing of torchvision's "
                    "SSD and RetinaNet and of raw YOLO heads (--nms) at fixed shapes; for this model, export the "
                    "part before its value-dependent post-processing and post-process its outputs in your own "
                    "code".format(
                        inner.library))
        return CaptureError("{} branches on tensor values{}; a capture at fixed shapes cannot follow that{}".format(
            name, location, code), hint=hint)
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return CaptureError(
        "torch.export could not capture {}{}: {}{}".format(name, location, first_line, code),
        hint="run with EDGEDYN_DEBUG=1 for the full torch.export error",
    )


def _explain_eager_failure(error: Exception, name: str, labels: List[str]) -> CaptureError:
    """The model raised when run eagerly on the example inputs: the model's line, not a torch traceback."""
    location, code = describe(error)
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return CaptureError(
        "{} raised {}{} on the example inputs {}: {}{}".format(
            name, type(error).__name__, location, ",".join(labels) or "(none)", first_line[:300], code),
        hint="check the --input shapes and dtypes against what the model expects (its rank too), or fix the "
             "model; EDGEDYN_DEBUG=1 shows the full traceback")
