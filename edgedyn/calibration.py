"""Calibration and evaluation inputs for `--quantize`: where they come from, and how they meet each specialization.

A source is a folder of .npy files (one sample each, or one file per input named after it inside a sub-folder per
sample), an .npz (one array per input, the samples stacked along dim 0), `path.py:fn` (a function returning an
iterable of input tuples or of {input name: array} dicts), or the word `random`. Samples are tuples of arrays in
the order of the model's tensor inputs. Each specialization gets batches of exactly its input shapes: samples that already have them are used as
they are; otherwise the samples are concatenated along dim 0 and cut again to the specialization's batch size (so
the same 1x64 samples calibrate both x=1x64 and x=8x64).

Note: a source that names its arrays is matched to the inputs by name, never by position: an .npz's keys (`x` or
`input.x`), the file names inside a folder per sample (`sample0/x.npy`), a dict's keys. Wrong names are refused
with the expected ones; the right names in another order are reordered. Only sources without names (a flat folder
of .npy files, one sample each; tuples) are taken in input order.
"""
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.errors import EdgedynError

log = logging.getLogger("edgedyn")
RANDOM = "random"
RANDOM_SAMPLES = 32
Sample = Tuple[np.ndarray, ...]

RANDOM_REFUSED = (
    "--quantize {mode} needs calibration data: int8 scales are the ranges activations take on real inputs, and "
    "random inputs give meaningless scales (the accuracy numbers would describe noise, not your data)")
RANDOM_WARNING = ("warning: --calibration random: int8 scales from random normal inputs, not from your data; the "
                  "accuracy numbers describe noise (use it for smoke tests only)")
RANDOM_HINT = ("pass --calibration DIR (a folder of .npy files), FILE.npz or path.py:fn returning input tuples; "
               "--calibration random accepts random normal inputs anyway (for smoke tests only)")


@dataclass(frozen=True)
class Samples:
    """Samples from one source, in tensor-input order; `random` when they are to be drawn per specialization."""

    source: str
    samples: Tuple[Sample, ...] = ()
    random: bool = False
    names: Tuple[str, ...] = ()  # the input each array of a sample is for, when the source names them (.npz)

    def __post_init__(self) -> None:
        if not self.random and not self.samples:
            raise EdgedynError("{} holds no samples".format(self.source),
                               hint="calibration needs at least one input sample; a few hundred is typical")


def load(source: Any, what: str = "--calibration") -> Samples:
    """The samples of a source: a path string (folder, .npz, .npy, path.py:fn), `random`, or an iterable of tuples."""
    if isinstance(source, Samples):
        return source
    if isinstance(source, str) and source == RANDOM:
        log.warning(RANDOM_WARNING)
        return Samples(source=RANDOM, random=True)
    if not isinstance(source, (str, Path)):
        return _from_items("<iterable>", source)
    text = str(source)
    if ".py:" in text:
        return _from_items(text, _call_function(text, what))
    path = Path(text)
    if not path.exists():
        raise EdgedynError("{} {}: no such file or folder".format(what, text), hint=RANDOM_HINT)
    if path.is_dir():
        samples, names = _folder(path, what)
        return Samples(source=text, samples=samples, names=names)
    if path.suffix == ".npz":
        with np.load(str(path), allow_pickle=False) as data:
            names = tuple(key[len("input."):] if key.startswith("input.") else key for key in data.files)
            arrays = [data[key] for key in data.files]
        return Samples(source=text, samples=tuple(zip(*[list(a) for a in arrays])) if arrays else (), names=names)
    if path.suffix == ".npy":
        return Samples(source=text, samples=tuple((a,) for a in np.load(str(path), allow_pickle=False)))
    raise EdgedynError("{} {}: expected a folder of .npy files, an .npz, or path.py:fn".format(what, text),
                       hint=RANDOM_HINT)


def _folder(path: Path, what: str) -> Tuple[Tuple[Sample, ...], Tuple[str, ...]]:
    """A flat folder's .npy files (one sample each, unnamed), or one sub-folder per sample whose .npy files are
    named after the inputs (the names, in the files' sorted order)."""
    files = sorted(path.glob("*.npy"))
    if files:
        return tuple((np.load(str(f), allow_pickle=False),) for f in files), ()
    folders = sorted(p for p in path.iterdir() if p.is_dir())
    if not folders:
        raise EdgedynError("{} {}: the folder has no .npy files".format(what, path), hint=RANDOM_HINT)
    names = tuple(f.stem for f in sorted(folders[0].glob("*.npy")))
    for folder in folders:
        found = tuple(f.stem for f in sorted(folder.glob("*.npy")))
        if found != names:
            raise EdgedynError("{} {}: sample folder {} holds {}, but {} holds {}".format(
                what, path, folder.name, ", ".join(found) or "no .npy files", folders[0].name, ", ".join(names)),
                hint="give every sample folder one .npy per input, named after the input")
    samples = tuple(tuple(np.load(str(folder / (name + ".npy")), allow_pickle=False) for name in names)
                    for folder in folders)
    return samples, names


def _from_items(source: str, items: Any) -> Samples:
    """Samples from an iterable of tuples (input order) or of {name: array} dicts (matched by name later)."""
    items = list(items)
    if not items or not all(isinstance(item, dict) for item in items):
        return Samples(source=source, samples=tuple(_as_sample(item) for item in items))
    names = tuple(items[0])
    if any(tuple(item) != names for item in items):
        raise EdgedynError("{}: every sample dict must have the same keys; the first has {}".format(
            source, ", ".join(names)), hint="give each sample as {input name: array} for every tensor input")
    return Samples(source=source, samples=tuple(_as_sample([item[name] for name in names]) for item in items),
                   names=names)


def _call_function(reference: str, what: str) -> Any:
    file_name, function = reference.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("edgedyn_calibration", file_name)
    if spec is None or not Path(file_name).exists():
        raise EdgedynError("{} {}: cannot load {}".format(what, reference, file_name), hint=RANDOM_HINT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    if not hasattr(module, function):
        raise EdgedynError("{} {}: {} has no function '{}'".format(what, reference, file_name, function))
    return getattr(module, function)()


def _as_sample(item: Any) -> Sample:
    items = item if isinstance(item, (tuple, list)) else (item,)
    return tuple(np.asarray(x.detach().numpy() if hasattr(x, "detach") else x) for x in items)


def split(samples: Samples, held_out: float = 0.2) -> Tuple[Samples, Samples]:
    """(calibration, evaluation): the last `held_out` share of the samples (at least one) is kept for evaluation.

    With a single sample both sides share it: the accuracy numbers then say so in the manifest.
    """
    if samples.random:
        return samples, samples
    count = len(samples.samples)
    held = max(1, int(round(count * held_out))) if count > 1 else 0
    calibrate = samples.samples[:count - held] if held else samples.samples
    evaluate = samples.samples[count - held:] if held else samples.samples
    return (Samples(source=samples.source, samples=calibrate, names=samples.names),
            Samples(source=samples.source + " (held out)" if held else samples.source, samples=evaluate,
                    names=samples.names))


def by_name(samples: Samples, names: Sequence[str]) -> Samples:
    """The samples with their arrays in the order of `names` when the source named them; refuses other names."""
    if samples.random or not samples.names:
        return samples
    given = list(samples.names)
    unknown = [name for name in given if name not in names]
    missing = [name for name in names if name not in given]
    if unknown or missing:
        found = "has no array for {}".format(", ".join(missing)) if missing else ""
        if unknown:
            found = "; ".join(part for part in ("has array(s) {} that name no input".format(", ".join(unknown)),
                                                found) if part)
        raise EdgedynError("{} {}; the model's tensor inputs are: {}".format(samples.source, found, ", ".join(names)),
                           hint="save one array per input under its name: numpy.savez(path, {}), or a folder "
                                "per sample holding {}".format(", ".join("{}=...".format(name) for name in names),
                                                               ", ".join(name + ".npy" for name in names)))
    order = [given.index(name) for name in names]
    return Samples(source=samples.source, samples=tuple(tuple(sample[i] for i in order) for sample in samples.samples),
                   names=tuple(names))


def batches(samples: Samples, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
            seed: int = 0, count: Optional[int] = None, names: Optional[Sequence[str]] = None) -> List[List[np.ndarray]]:
    """Input lists of exactly `shapes` for one specialization (see the module docstring); `names` are its tensor
    inputs, which a source that names its arrays is matched against."""
    if names is not None:
        samples = by_name(samples, names)
    if samples.random:
        rng = np.random.default_rng(seed)
        return [[rng.standard_normal(tuple(s)).astype(d) for s, d in zip(shapes, dtypes)]
                for _ in range(count or RANDOM_SAMPLES)]
    for sample in samples.samples:
        if len(sample) != len(shapes):
            raise EdgedynError("{}: a sample has {} array(s), the model takes {} tensor input(s)".format(
                samples.source, len(sample), len(shapes)), hint="return one tuple of arrays per sample, in input order")
    if all(tuple(a.shape) == tuple(s) for sample in samples.samples for a, s in zip(sample, shapes)):
        return [[np.asarray(a, dtype=d, order="C") for a, d in zip(sample, dtypes)] for sample in samples.samples]
    columns = []
    for index, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        arrays = [np.asarray(sample[index]) for sample in samples.samples]
        rows = [a.reshape((1,) + a.shape) if a.ndim == len(shape) - 1 else a for a in arrays]
        if any(r.ndim != len(shape) or tuple(r.shape[1:]) != tuple(shape[1:]) for r in rows):
            raise EdgedynError("{}: input {} has samples of shape {}, the specialization needs {}".format(
                samples.source, index, sorted({tuple(a.shape) for a in arrays}), "x".join(map(str, shape))),
                hint="give samples of the exported shape, or of the same shape without the batch dimension")
        columns.append(np.concatenate(rows).astype(dtype))
    total, batch = columns[0].shape[0], int(shapes[0][0]) if shapes[0] else 1
    if total < batch:  # fewer rows than one batch: repeat them, the ranges are still those of the data
        columns = [np.concatenate([c] * (-(-batch // total))) for c in columns]
        total = columns[0].shape[0]
    return [[np.asarray(c[start:start + batch], order="C") for c in columns]
            for start in range(0, total - batch + 1, batch)]
