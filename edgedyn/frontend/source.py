"""Where in the model's source a capture failed: the innermost frame outside torch, edgedyn and the standard
library, whether that is the user's file or a library's (torchvision's post-processing), and the user's own
line that led there."""
import inspect
import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import torch

# Folders, each ending in a separator: torch's folder name is a prefix of torchvision's.
_SKIPPED = tuple(os.path.join(str(folder), "") for folder in (
    Path(torch.__file__).resolve().parent, Path(__file__).resolve().parents[1], Path(inspect.__file__).resolve().parent))
_INSTALLED = ("site-packages", "dist-packages")


@dataclass(frozen=True)
class Frame:
    path: str  # as a person reads it: the user's path, or a library's path from its package (torchvision/ops/...)
    line: int
    code: str
    function: str
    library: Optional[str]  # the installed package this frame is in, None for the user's own code

    @property
    def location(self) -> str:
        return "{}:{}".format(self.path, self.line)


def failure_frames(error: BaseException) -> Tuple[Optional[Frame], Optional[Frame]]:
    """(the innermost frame of model code, library or not; the innermost frame of the user's own code)."""
    inner = user = None
    for frame in _frames(error):
        inner = frame
        if frame.library is None:
            user = frame
    return inner, user


def describe(error: BaseException) -> Tuple[str, str]:
    """(" at PATH:LINE[ in FUNCTION of LIBRARY (called from USER:LINE)]", "\\n    the code") for a message."""
    inner, user = failure_frames(error)
    if inner is None:
        return "", ""
    location = " at {}".format(inner.location)
    if inner.library is not None:
        location += " (in {}'s {}".format(inner.library, inner.function)
        location += ", called from {})".format(user.location) if user is not None else ")"
    return location, "\n    {}".format(inner.code) if inner.code else ""


def _frames(error: BaseException) -> List[Frame]:
    frames = []
    seen = set()
    current = error  # type: Optional[BaseException]
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for frame in traceback.extract_tb(current.__traceback__):
            resolved = str(Path(frame.filename).resolve())
            if resolved.startswith(_SKIPPED) or frame.filename.startswith("<"):
                continue
            library, path = _library_path(resolved)
            frames.append(Frame(path if library else frame.filename, frame.lineno or 0, (frame.line or "").strip(),
                                frame.name, library))
        current = current.__cause__ or current.__context__
    return frames


def _library_path(path: str) -> Tuple[Optional[str], str]:
    """(the installed package, the path from its folder) for a file in site-packages, else (None, path)."""
    parts = Path(path).parts
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in _INSTALLED and index + 1 < len(parts):
            inside = parts[index + 1:]
            return inside[0].split(".")[0], "/".join(inside)
    return None, path
