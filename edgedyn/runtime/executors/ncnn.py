"""Runs an ncnn model (model.param + weights.bin written by edgedyn's ncnn backend) on the CPU with ncnn.

ncnn has no batch axis: a blob is at most (c, d, h, w). edgedyn's ncnn artifacts take each item of the first axis
as one run (pnnx converts the graph that way), so a call with batch N runs N extractors, one after the other, and
stacks their outputs; the backend checked at export that this computes what torch does.

The artifact records the precision it was built and gated for; ncnn's own default is fp16 storage and arithmetic
wherever the CPU has them (and fp16 storage of some weights on x86 with F16C), so every fp16 option is set here
explicitly: on for an fp16 artifact on an Arm v8.2 core that ncnn also sees as one, off otherwise, and
precision()/describe() say why (runtime/precision.py). One Net per model (its create_extractor is thread-safe,
ncnn's maintainers say), one Extractor per item of each call.
"""
import os
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edgedyn.runtime import precision as precisions
from edgedyn.runtime import schema
from edgedyn.runtime.errors import BundleError, ExecutionError, MissingDependencyError
from edgedyn.runtime.executors import ncnn_mixed
from edgedyn.runtime.executors.ncnn_param import Layer, check_model
from edgedyn.runtime.format import host_arch

_HINT = "pip install 'edgedyn[ncnn]'"
# The ncnn options a board file may set ([ncnn] table, recorded in the artifact), each with the values it takes;
# the precision options and Vulkan are the executor's, never a board's.
OPTION_CHOICES = {
    "lightmode": bool,
    "use_packing_layout": bool,
    "use_winograd_convolution": bool,
    "use_sgemm_convolution": bool,
    "openmp_blocktime": int,
}  # type: Dict[str, Any]
MAX_BLOCKTIME_MS = 400
FP16_OPTIONS = ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic")
MAX_BATCH = 1 << 16
MAX_ITEM_RANK = 4  # ncnn's Mat: w, h, d, c
_F32 = np.dtype(np.float32)
# A layer's forward returns ncnn's status: -100 when an allocation failed (the board is out of memory).
OUT_OF_MEMORY = -100
_OUT_OF_MEMORY_HINT = ("free memory on the board (fewer threads, a smaller input), then run `edgedyn verify` on "
                       "the bundle")
_FAILED_HINT = "run `edgedyn verify` on the bundle; export it again if it fails"


def _import_ncnn() -> Any:
    try:
        import ncnn
    except ImportError as error:
        raise MissingDependencyError("this bundle runs on ncnn, which is not installed ({})".format(error),
                                     hint="{}  (a Python 3.8 board such as a Jetson Nano: pip install --no-deps "
                                          "ncnn; see docs/backends.md)".format(_HINT))
    return ncnn


def options(artifact: Dict[str, Any]) -> Dict[str, Any]:
    """The artifact's recorded ncnn options, each checked against OPTION_CHOICES."""
    recorded = artifact.get("ncnn", {}).get("options", {})
    if not isinstance(recorded, dict):
        raise BundleError("ncnn.options: expected a table, got {}".format(schema.short(recorded)), hint=schema.HINT)
    for key, value in recorded.items():
        kind = OPTION_CHOICES.get(key)
        valid = (kind is bool and isinstance(value, bool)) or (
            kind is int and type(value) is int and 0 <= value <= MAX_BLOCKTIME_MS)
        if not valid:
            raise BundleError("ncnn.options: {} = {} is not allowed".format(schema.short(key), schema.short(value)),
                              hint="options a board file may set: {} (openmp_blocktime in ms, 0-{})".format(
                                  ", ".join(sorted(OPTION_CHOICES)), MAX_BLOCKTIME_MS))
    return dict(recorded)


def _shapes(artifact: Dict[str, Any], key: str, count: int) -> List[Tuple[int, ...]]:
    """The per-item shapes the artifact records for its inputs or outputs (the torch shapes without the batch)."""
    recorded = artifact.get("ncnn", {}).get(key)
    c = schema.Checker("artifact", "ncnn")
    shapes = c.items(recorded, "ncnn." + key, count)
    for index, shape in enumerate(shapes):
        for dim in c.items(shape, "ncnn.{}[{}]".format(key, index)):
            c.integer(dim, "ncnn.{}[{}]".format(key, index), 1, 1 << 31)
        if not 1 <= len(shape) <= MAX_ITEM_RANK:
            raise c.fail("ncnn.{}[{}]".format(key, index), "an item of rank {}; ncnn holds 1-{}".format(
                len(shape), MAX_ITEM_RANK))
    return [tuple(shape) for shape in shapes]


def _check_names(layers: List[Layer], inputs: List[str], outputs: List[str]) -> None:
    fed = [layer.tops[0] for layer in layers if layer.type == "Input"]
    made = {top for layer in layers for top in layer.tops}
    if sorted(fed) != sorted(inputs):
        raise BundleError("the ncnn model's inputs are {}, the manifest's {}".format(
            schema.bounded(fed), schema.bounded(inputs)), hint=schema.HINT)
    missing = [name for name in outputs if name not in made]
    if missing:
        raise BundleError("the ncnn model makes no blob {}".format(schema.bounded(missing)), hint=schema.HINT)


class NcnnExecutor:
    """One ncnn Net over the bundle's model; an Extractor per item of each call."""

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options_: Dict[str, Any]) -> None:
        ncnn = _import_ncnn()
        files = artifact["files"]
        param, weights = bundle.read(files["model"]), bundle.read(files["weights"])
        label = "bundle {}: {}".format(getattr(bundle, "path", "?"), files["model"])
        self._inputs, self._outputs = list(artifact["input_names"]), list(artifact["output_names"])
        self._input_shapes = _shapes(artifact, "input_shapes", len(self._inputs))
        self._output_shapes = _shapes(artifact, "output_shapes", len(self._outputs))
        layers = check_model(param, weights, label, dict(zip(self._inputs, self._input_shapes)),
                             options_.get("declared_bytes"))
        _check_names(layers, self._inputs, self._outputs)
        self._batch = schema.Checker("artifact", "ncnn").integer(artifact.get("ncnn", {}).get("batch"), "ncnn.batch",
                                                                 1, MAX_BATCH)
        unknown = sorted({layer.type for layer in layers if ncnn.layer_to_index(layer.type) < 0})
        if unknown:
            raise MissingDependencyError("this ncnn ({}) has no layer {}, which the bundle uses".format(
                ncnn.__version__, schema.bounded(unknown)), hint="pip install -U ncnn")
        requested = artifact.get("precision", precisions.FP32)
        if requested not in (precisions.FP32, "fp16"):
            raise BundleError("artifact precision {} is not fp32 or fp16".format(schema.short(requested)),
                              hint=schema.HINT)
        self._requested = requested
        self._precision, self._why_not = _effective(ncnn, requested)
        self._version_note = _older_note(ncnn.__version__, artifact.get("ncnn", {}).get("ncnn_at_export"))
        self._fp32_layers = len(ncnn_mixed.masked(layers))
        if self._fp32_layers and self._precision == "fp16" and not ncnn_mixed.entry_computes_fp32(ncnn):
            raise MissingDependencyError(
                "this ncnn ({}) has an fp16 kernel for {}, through which the bundle's {} fp32 layers read their "
                "inputs: they would read fp16 as fp32".format(ncnn.__version__, ncnn_mixed.ENTRY, self._fp32_layers),
                hint="pip install 'ncnn=={}' (what the bundle was exported with)".format(
                    schema.short(artifact.get("ncnn", {}).get("ncnn_at_export"), 40)))
        self._net = ncnn.Net()
        opt = self._net.opt
        for key, value in options(artifact).items():
            setattr(opt, key, value)
        for key in FP16_OPTIONS:  # before load_param: ncnn picks each layer's kernels from them
            setattr(opt, key, self._precision == "fp16")
        opt.use_bf16_storage = False
        opt.use_vulkan_compute = False
        if options_.get("threads"):
            opt.num_threads = int(options_["threads"])
        self._threads = int(opt.num_threads)
        load_net(self._net, param, weights, label)
        self._copy = [_read_in_place(layers, name) for name in self._inputs]
        self._called_shapes = [(self._batch,) + shape for shape in self._input_shapes]
        self._extracted = [(name, (1,) + shape, int(np.prod(shape, dtype=np.int64)))
                           for name, shape in zip(self._outputs, self._output_shapes)]
        self._ncnn = ncnn
        self.artifact = artifact

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        if len(inputs) != len(self._inputs):
            raise BundleError("the ncnn model takes {} inputs, the call gave {}".format(len(self._inputs),
                                                                                        len(inputs)), hint=schema.HINT)
        for name, array, shape in zip(self._inputs, inputs, self._called_shapes):
            if array.shape != shape:
                raise BundleError("input {}: shape {} is not the {} this ncnn model was made for".format(
                    name, tuple(array.shape), shape), hint=schema.HINT)
        items = [np.asarray(array, _F32, "C") for array in inputs]  # the array itself when it is one
        if self._batch == 1:  # the common call: its item's outputs are the outputs
            return self._item(items, 0)
        done = [self._item(items, index) for index in range(self._batch)]
        return [np.concatenate([item[slot] for item in done]) for slot in range(len(self._outputs))]

    def _item(self, items: List[np.ndarray], index: int) -> List[np.ndarray]:
        """The outputs of item `index` of the call, each of shape (1,) + the item's."""
        extractor = self._net.create_extractor()
        for name, array, copy in zip(self._inputs, items, self._copy):
            mat = self._ncnn.Mat(array[index])  # over the caller's memory, which ncnn only reads...
            extractor.input(name, mat.clone() if copy else mat)  # ...unless an in-place layer reads it
        values = []
        for name, shape, size in self._extracted:
            code, mat = extractor.extract(name)
            if code != 0 or mat.empty():  # a failed layer leaves an empty Mat, and numpy over one crashes
                memory = code == OUT_OF_MEMORY
                raise ExecutionError("ncnn could not compute output {} (status {}{})".format(
                    name, code, ": ncnn could not allocate memory" if memory else ""),
                    hint=_OUT_OF_MEMORY_HINT if memory else _FAILED_HINT)
            value = np.array(mat)  # ncnn's memory, copied: it returns to ncnn's pool with the extractor
            if value.size != size:
                raise BundleError("ncnn computed output {} as {} values of shape {}; the model declares {}".format(
                    name, value.size, value.shape, shape[1:]), hint=schema.HINT)
            values.append(value.reshape(shape))
        return values

    def precision(self) -> Tuple[str, Optional[str]]:
        """(the precision this executor computes in, why it is not the artifact's or None)."""
        return self._precision, self._why_not

    def describe(self) -> Dict[str, Any]:
        opt = self._net.opt
        described = {"executor": "ncnn", "device": "cpu", "ncnn": self._ncnn.__version__,
                     "precision": self._precision, "precision_requested": self._requested, "threads": self._threads,
                     "fp16": {key[4:]: bool(getattr(opt, key)) for key in FP16_OPTIONS}, "batch_runs": self._batch}
        if host_arch() == "aarch64":
            described["cpu_fp16"] = bool(self._ncnn.cpu_support_arm_asimdhp())  # what ncnn itself sees
        if self._fp32_layers and self._precision == "fp16":
            described["fp32_layers"] = self._fp32_layers
        if self._why_not:
            described["precision_note"] = self._why_not
        if self._version_note:
            described["version_note"] = self._version_note
        return described


# Note: the layers that read a blob without writing to it or passing it on (each makes a new blob): an input read
# only by these (directly or through Split) is handed to ncnn without a copy. See _read_in_place.
READ_ONLY = frozenset(("Convolution", "ConvolutionDepthWise", "InnerProduct"))


def _read_in_place(layers: List[Layer], name: str) -> bool:
    """Whether ncnn could reach input `name` with an in-place layer, or a layer not known to leave it alone.

    A Mat over numpy's memory has no reference count: in its default light mode ncnn dereferences the count of
    every blob an in-place layer (ReLU, BinaryOp, ...) reads, to copy a shared one first, and crashes on this one;
    and the layer would write into the caller's array. Split passes the same Mat on. When every layer reading the
    input is in READ_ONLY the call hands ncnn the caller's memory (the first layer of a CNN is a Convolution: 4.9 MB
    not copied per call for a 640x640 image); otherwise it gives ncnn a copy that ncnn owns."""
    blobs, seen = [name], set()
    while blobs:
        blob = blobs.pop()
        seen.add(blob)
        for layer in layers:
            if blob not in layer.bottoms:
                continue
            if layer.type == "Split":
                blobs.extend(top for top in layer.tops if top not in seen)
            elif layer.type not in READ_ONLY:
                return True
    return False


def _older_note(here: str, checked: Any) -> Optional[str]:
    """A note when this ncnn is older than the one the export checked the model with: older releases compute some
    graphs wrong (1.0.20250503 and 1.0.20260526 gave NaN for DeepLabV3-MobileNetV3's upsampling from 1x1)."""
    def version(text: str) -> Tuple[int, ...]:
        return tuple(int(part) for part in text.split(".") if part.isdigit())

    if not isinstance(checked, str) or len(checked) > 40 or version(here) >= version(checked):
        return None
    return "ncnn {} here is older than the {} this model was checked with at export: run `edgedyn verify` on this " \
           "board, or pip install -U ncnn".format(here, schema.short(checked))


def _effective(ncnn: Any, requested: str) -> Tuple[str, Optional[str]]:
    """The precision an artifact computes in here: fp16 only on an Arm v8.2 core, as both edgedyn and ncnn see it."""
    arch = host_arch()
    if requested != "fp16":
        return requested, None
    if arch != "aarch64":
        return precisions.FP32, "fp16 artifact computes in fp32 here: ncnn computes fp16 on Arm v8.2 cores only"
    computes, why_not = precisions.effective(requested, arch)
    if computes == "fp16" and not ncnn.cpu_support_arm_asimdhp():
        return precisions.FP32, "fp16 artifact computes in fp32 here: ncnn finds no fp16 arithmetic (asimdhp)"
    return computes, why_not


def load_net(net: Any, param: bytes, weights: bytes, label: str) -> None:
    """The text from memory (a bundle's once ncnn_param.py checked it; the ncnn backend's rewrites load pnnx's own
    at export); the weights through a private file ncnn reads and copies (its Python load_model_mem reports no
    error), removed at once."""
    if net.load_param_mem(param.decode("ascii")) != 0:
        raise BundleError("{}: ncnn refused the model text".format(label), hint=schema.HINT)
    with tempfile.TemporaryDirectory(prefix="edgedyn-ncnn-") as folder:
        path = os.path.join(folder, "weights.bin")
        with open(path, "wb") as handle:
            handle.write(weights)
        if net.load_model(path) != 0:
            raise BundleError("{}: ncnn could not load the weights".format(label), hint=schema.HINT)
