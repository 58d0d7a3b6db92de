"""Which layers a reduced precision costs most accuracy in, probed on the emulated board, for a mixed candidate.

When an fp16 artifact of a backend that `probes_layers` (ncnn) misses the float gate on the emulated board, the
gate's error often comes from few layers: ncnn's fp16 on torchvision's MobileNetV3-Large reaches cosine 0.99683 to
torch, and 0.99991 with one of its 120 layers (a stride-2 depthwise convolution) in fp32, where no prefix of its
layers in fp32 gains anything (docs/precision.md, "Mixed: the layers a probe names"). So the probe runs the artifact
on the board with layers of ncnn_mixed.PROBED in fp32 and measures each variant against torch eager as the gate
does, on PROBE_BATCHES of the gate's own inputs. qemu emulates fp16 arithmetic slowly (a MobileNetV3-Large call
takes ~6 s), so it searches in steps: first groups of about sqrt(N) consecutive layers, each group in fp32 at
once, then each layer of the groups that gain most alone. It names the layers whose gains (the error with every
layer in fp16 less the error with that layer in fp32; the error is 1 - the lowest output cosine) are largest, the
fewest that bring the error to half the gate's allowance. Gains add only roughly, so it then measures the best
layers together, in sets of growing size (1, 2, 3, 4, 6, 9...), and names the smallest set that does; the sum's
choice when none smaller does, the whole chosen groups when no few layers do. The candidate with those layers in
fp32 then goes through the same gate and count as every other (onboard.py): a probe only proposes, never passes
anything itself.
"""
import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.errors import EdgedynError

# The most layers one probe may search among: a model with more is not probed.
MAX_PROBED = 400
# The gate's inputs each variant runs on: enough to rank layers (the candidate then meets the gate on all of them).
PROBE_BATCHES = 2
# The probe names layers until the error they leave is at most the gate's allowance divided by this.
MARGIN = 2.0
# The sizes of the sets of best layers measured together: each about this many times the last (1, 2, 3, 4, 6, 9...).
SIZE_STEP = 1.5

# On the board: the probe bundle's one ncnn artifact run on the first batches after the example, with every layer in
# fp16 ("base", when asked) and once per listed (key, layer names) with those layers in fp32, through the runtime's
# own executor and checks. Several such processes split the variants between them. Python 3.8 syntax.
_PROBE = """
import json, sys, tempfile
import numpy as np
from edgedyn.runtime.format import MemoryBundle
from edgedyn.runtime.program import load
from edgedyn.runtime.executors.ncnn import NcnnExecutor
from edgedyn.runtime.executors.ncnn_mixed import mark_fp32
bundle, inputs, outputs, listed, count, base = sys.argv[1:7]
program = load(bundle, threads=1, device="cpu")
artifact = program.specializations[0].artifact
files = artifact["files"]
param = program.bundle.read(files["model"]).decode("ascii")
weights = program.bundle.read(files["weights"])
data = np.load(inputs, allow_pickle=False)
batches = [[data["{}.{}".format(b, i)] for i in range(int(data["arity"]))] for b in range(1, 1 + int(count))]
variants = ([("base", [])] if base == "1" else []) + [(k, names) for k, names in json.loads(open(listed).read())]
results = {}
for key, names in variants:
    text = mark_fp32(param, names) if names else param
    with tempfile.TemporaryDirectory() as folder:
        members = MemoryBundle({files["model"]: text.encode("ascii"), files["weights"]: weights}, folder)
        executor = NcnnExecutor(members, artifact, {"threads": 1})
        if executor.precision()[0] != "fp16":
            raise SystemExit("the probe computed in {}, not fp16".format(executor.precision()[0]))
        for b, batch in enumerate(batches):
            for j, value in enumerate(executor.run(batch)):
                results["{}.{}.{}".format(key, b, j)] = np.asarray(value)
np.savez(outputs, **results)
"""


def probe(measurement: Any, label: str, staged: Tuple[Path, Path, Path], artifact: Any, accuracy: Any,
          step: Callable[[str], None]) -> Tuple[str, ...]:
    """The layers to keep in fp32 in `artifact` (an fp16 candidate that missed `accuracy`, a FloatGate, on the
    emulated board), those worth most first; () when no group of layers gains anything. Raises EdgedynError when
    the probe cannot run (too many layers, or the board failed it)."""
    from edgedyn.runtime.executors.ncnn_mixed import probed_layers
    from edgedyn.runtime.executors.ncnn_param import parse_param

    names = probed_layers(parse_param(artifact.files["model"], label))
    if not names or len(names) > MAX_PROBED:
        raise EdgedynError("{} has {} layers to probe (1-{})".format(label, len(names), MAX_PROBED))
    gate = accuracy.first(PROBE_BATCHES)
    size = max(1, int(round(math.sqrt(len(names)))))
    groups = [tuple(names[start:start + size]) for start in range(0, len(names), size)]
    step("{}: probing which of its {} layers fp16 costs most accuracy in, {} groups first, on {}".format(
        label, len(names), len(groups), measurement.where()))
    errors = _errors(measurement, label, staged, gate, groups, base=True)
    everything = errors.pop(())
    picked, _ = chosen(groups, everything, [errors[group] for group in groups], gate.gate.min_cosine)
    whole = tuple(name for group in picked for name in group)
    if len(whole) == len(picked):  # groups of one layer: nothing to refine
        return whole
    singles = [(name,) for name in whole]
    errors = _errors(measurement, label, staged, gate, singles, base=False)
    layers, few = chosen(singles, everything, [errors[single] for single in singles], gate.gate.min_cosine)
    ranked = [name for _, name in sorted(((errors[single] - everything, single[0]) for single in singles
                                          if errors[single] < everything), key=lambda pair: pair[0])]
    measured = _together(measurement, label, staged, gate, ranked, len(layers) if few else 0, step)
    if measured:
        return measured
    return tuple(name for single in layers for name in single) if few else whole


def _together(measurement: Any, label: str, staged: Tuple[Path, Path, Path], gate: Any, ranked: List[str],
              summed: int, step: Callable[[str], None]) -> Tuple[str, ...]:
    """The fewest of the best layers (`ranked`, the largest gain alone first) that, measured in fp32 together, leave
    at most the gate's allowance over MARGIN; () when no set tried does. The sets: the best 1, 2, 3, 4, 6, 9...
    (SIZE_STEP), the `summed` best (what the sum of the gains alone chose; 0: none) and all of them. Gains measured
    one layer at a time add up only roughly, both ways: on MobileNetV2's ncnn fp16 (emulated Orin) the sum asked for
    10 layers where its best 5 together already reached cosine 0.99961; where each layer's gain shrinks once others
    are fp32, the sum's choice leaves more than it says."""
    sizes, size = {len(ranked), summed} - {0}, 1
    while size < len(ranked):
        sizes.add(size)
        size = max(size + 1, int(size * SIZE_STEP))
    if not sizes:
        return ()
    sets = [tuple(ranked[:size]) for size in sorted(sizes)]
    step("{}: measuring its best {} layers together, {} sets".format(label, len(sets[-1]), len(sets)))
    errors = _errors(measurement, label, staged, gate, sets, base=False)
    return next((layers for layers in sets if errors[layers] <= _allowance(gate.gate.min_cosine) / MARGIN), ())


def _allowance(min_cosine: Optional[float]) -> float:
    """The error a gate allows: 1 - its cosine bound (0.001 when it bounds no cosine)."""
    return 1.0 - (min_cosine if min_cosine is not None else 0.999)


def chosen(variants: Sequence[Tuple[str, ...]], everything: float, alone: Sequence[float],
           min_cosine: Optional[float]) -> Tuple[List[Tuple[str, ...]], bool]:
    """(the variants to keep in fp32, by gain: `everything`, the error with every layer reduced, less `alone[i]`,
    the error with variant i's layers in fp32; the fewest whose gains bring the error to the gate's allowance
    (1 - min_cosine; 0.001 when the gate bounds no cosine) over MARGIN, else every one that gains; whether they
    did)."""
    allowance = _allowance(min_cosine)
    gains = sorted(((everything - error, index) for index, error in enumerate(alone) if everything - error > 0),
                   reverse=True)
    needed, kept, covered = everything - allowance / MARGIN, [], 0.0
    for gain, index in gains:
        if covered >= needed and kept:
            break
        kept.append(variants[index])
        covered += gain
    return kept, covered >= needed


def _errors(measurement: Any, label: str, staged: Tuple[Path, Path, Path], gate: Any,
            variants: Sequence[Tuple[str, ...]], base: bool) -> Dict[Tuple[str, ...], float]:
    """The gate's error of each variant (its layers in fp32) and, with `base`, of the artifact as built (key ())."""
    keys = {str(index): variant for index, variant in enumerate(variants)}
    outputs = measurement.probe_layers(label, staged, _PROBE, [[key, list(v)] for key, v in keys.items()],
                                       len(gate.batches), base)
    return {keys.get(key, ()): _error(gate, [outputs["{}.{}".format(key, b)] for b in range(len(gate.batches))])
            for key in list(keys) + (["base"] if base else [])}


def _error(accuracy: Any, outputs: Sequence[List[np.ndarray]]) -> float:
    """What the gate measures of `outputs` (one list per gate batch) as one error: 1 - the lowest output cosine."""
    calls = iter(outputs)
    cosines = [record.get("cosine") for record in accuracy.measure(lambda batch: next(calls))]
    return 1.0 - min(c if c is not None and c == c else -1.0 for c in cosines) if cosines else 1.0


def unpack(saved: Dict[str, np.ndarray]) -> Dict[str, List[np.ndarray]]:
    """The probe's saved arrays ("variant.batch.output") as "variant.batch" -> that call's outputs, in order."""
    calls = {}  # type: Dict[str, Dict[int, np.ndarray]]
    for key, value in saved.items():
        variant, batch, output = key.split(".")
        calls.setdefault("{}.{}".format(variant, batch), {})[int(output)] = value
    return {call: [values[j] for j in sorted(values)] for call, values in calls.items()}
