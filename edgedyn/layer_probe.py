"""Which layers a reduced precision costs most accuracy in, probed on the emulated board, for a mixed candidate.

When an fp16 artifact of a backend that `probes_layers` (ncnn) misses the float gate on the emulated board, the
gate's error often comes from few layers: ncnn's fp16 on torchvision's MobileNetV3-Large reaches cosine 0.99683 to
torch, and 0.99991 with one of its 120 layers (a stride-2 depthwise convolution) in fp32, where no prefix of its
layers in fp32 gains anything (benchmarks/README.md, "ncnn with its most sensitive layers in fp32"). So the probe
runs the artifact on the board once with every layer in fp16 and once per layer of ncnn_mixed.PROBED with that
layer alone in fp32 (one guest process, the gate's own inputs), measures each against torch eager as the gate
does, and names the layers whose fp32 gains most, fewest first, until the gains add up to twice what the gate
lacks. The candidate with those layers in fp32 then goes through the same gate and count as every other
(onboard.py): a probe only proposes, never passes anything itself.
"""
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.errors import EdgedynError

# The most layers one probe runs (each a whole inference per gate input under qemu): a model with more is not probed.
MAX_PROBED = 160
# The probe names layers until their summed gains cover this many times what the gate lacks (gains do not add
# exactly: two layers' errors partly cancel or compound).
MARGIN = 2.0

# On the board: the probe bundle's one ncnn artifact run on every batch with every layer in fp16, then once per
# named layer with that layer in fp32, through the runtime's own executor and checks. Python 3.8 syntax.
_PROBE = """
import json, sys, tempfile
import numpy as np
from edgedyn.runtime.format import MemoryBundle
from edgedyn.runtime.program import load
from edgedyn.runtime.executors.ncnn import NcnnExecutor
from edgedyn.runtime.executors.ncnn_mixed import mark_fp32
bundle, inputs, outputs, names = sys.argv[1:5]
program = load(bundle, threads=1, device="cpu")
artifact = program.specializations[0].artifact
files = artifact["files"]
param = program.bundle.read(files["model"]).decode("ascii")
weights = program.bundle.read(files["weights"])
data = np.load(inputs, allow_pickle=False)
batches = [[data["{}.{}".format(b, i)] for i in range(int(data["arity"]))] for b in range(int(data["batches"]))]
results = {}
for v, name in enumerate([None] + json.loads(open(names).read())):
    text = param if name is None else mark_fp32(param, [name])
    with tempfile.TemporaryDirectory() as folder:
        members = MemoryBundle({files["model"]: text.encode("ascii"), files["weights"]: weights}, folder)
        executor = NcnnExecutor(members, artifact, {"threads": 1})
        if executor.precision()[0] != "fp16":
            raise SystemExit("the probe computed in {}, not fp16".format(executor.precision()[0]))
        for b, batch in enumerate(batches):
            for j, value in enumerate(executor.run(batch)):
                results["{}.{}.{}".format(v, b, j)] = np.asarray(value)
np.savez(outputs, **results)
"""


def probe(measurement: Any, label: str, staged: Tuple[Path, Path, Path], artifact: Any, accuracy: Any,
          step: Callable[[str], None]) -> Tuple[str, ...]:
    """The layers to keep in fp32 in `artifact` (an fp16 candidate that missed `accuracy`, a FloatGate, on the
    emulated board), in the order the probe found them worth most; () when no layer alone gains anything. Raises
    EdgedynError when the probe cannot run (too many layers, or the board failed it)."""
    from edgedyn.runtime.executors.ncnn_mixed import probed_layers
    from edgedyn.runtime.executors.ncnn_param import parse_param

    names = probed_layers(parse_param(artifact.files["model"], label))
    if len(names) > MAX_PROBED:
        raise EdgedynError("{} has {} layers to probe, above {}".format(label, len(names), MAX_PROBED))
    step("{}: probing which of its {} layers fp16 costs most accuracy in, on {}".format(label, len(names),
                                                                                     measurement.where()))
    outputs = measurement.probe_layers(label, staged, _PROBE, names)
    batches = len(accuracy.batches)
    errors = [_error(accuracy, [outputs["{}.{}".format(variant, b)] for b in range(1, batches + 1)])
              for variant in range(len(names) + 1)]
    return chosen(names, errors[0], errors[1:], accuracy.gate.min_cosine)


def chosen(names: Sequence[str], everything: float, alone: Sequence[float], min_cosine: Optional[float]
           ) -> Tuple[str, ...]:
    """The layers to keep in fp32: by gain (`everything`, the error with every layer reduced, less `alone[i]`, the
    error with layer i in fp32), the fewest whose gains cover MARGIN times the excess over the gate's allowance
    (1 - min_cosine; 0.001 when the gate bounds no cosine); every layer that gains when none suffice."""
    allowance = 1.0 - (min_cosine if min_cosine is not None else 0.999)
    gains = sorted(((everything - error, name) for name, error in zip(names, alone) if everything - error > 0),
                   reverse=True)
    needed, kept, covered = MARGIN * max(everything - allowance, 0.0), [], 0.0
    for gain, name in gains:
        if covered >= needed and kept:
            break
        kept.append(name)
        covered += gain
    return tuple(kept)


def _error(accuracy: Any, outputs: Sequence[List[np.ndarray]]) -> float:
    """What the gate measures of `outputs` (one list per gate batch) as one error: 1 - the lowest output cosine."""
    from edgedyn.onboard import replay

    cosines = [record.get("cosine") for record in accuracy.measure(replay(list(outputs)))]
    return 1.0 - min(c if c is not None and c == c else -1.0 for c in cosines) if cosines else 1.0


def unpack(saved: Dict[str, np.ndarray]) -> Dict[str, List[np.ndarray]]:
    """The probe's saved arrays ("variant.batch.output") as "variant.batch" -> that call's outputs, in order."""
    calls = {}  # type: Dict[str, Dict[int, np.ndarray]]
    for key, value in saved.items():
        variant, batch, output = key.split(".")
        calls.setdefault("{}.{}".format(variant, batch), {})[int(output)] = value
    return {call: [values[j] for j in sorted(values)] for call, values in calls.items()}
