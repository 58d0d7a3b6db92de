"""Finds the user's model: `path/to/model.py:Name`, `package.module:Name`, `model.onnx` or `program.pt2`."""
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from edgedyn.errors import CaptureError


def load_reference(reference: str) -> Tuple[Any, Optional[Callable[[], Any]], str]:
    """Resolves a model reference to (model or function, its example inputs function if any, the name).

    `file.py:name` (a model file), `model.onnx`, `program.pt2` (a saved ExportedProgram; both with example inputs
    at the file's fixed shapes) or `package.module:name` (a model in an installed package).
    """
    suffix = Path(reference).suffix.lower()
    if suffix in FILE_LOADERS and ":" not in Path(reference).name:
        path = Path(reference)
        if not path.is_file():
            raise CaptureError("model file {} does not exist".format(path), hint="check the path")
        model, examples = FILE_LOADERS[suffix](path)
        return model, examples, path.stem
    path_text, _, attribute = reference.rpartition(":")
    if not path_text or not attribute:
        raise CaptureError(
            "cannot read model reference {!r}".format(reference),
            hint="write it as path/to/model.py:Name (e.g. examples/tiny_cnn.py:TinyCNN), package.module:Name, "
                 "model.onnx or program.pt2",
        )
    path = Path(path_text)
    if path.suffix != ".py" and _MODULE_NAME.match(path_text) and not path.exists():
        module = _import_module(path_text)
        where = path_text
    else:
        if not path.is_file():
            raise CaptureError("model file {} does not exist".format(path), hint="check the path before the ':'")
        module = _import_file(path)
        where = str(path)
    if not hasattr(module, attribute):
        names = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                       and getattr(v, "__module__", None) == module.__name__)
        raise CaptureError(
            "{} has no attribute {!r}".format(where, attribute),
            hint="names defined there: {}".format(", ".join(names) or "(none)"),
        )
    examples = getattr(module, "example_inputs", None)
    return resolve_model(getattr(module, attribute), reference), examples if callable(examples) else None, attribute


_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise CaptureError("no module named {!r} (and no file {} here)".format(error.name or name, name),
                           hint="install the package that provides it, or give a file: path/to/model.py:Name") from error
    except Exception as error:
        raise CaptureError("importing {} failed: {}: {}".format(name, type(error).__name__, error)) from error


def _load_program(path: Path) -> Tuple[Any, Callable[[], Any]]:
    """A saved ExportedProgram: its module, and example inputs at the shapes it was exported with."""
    import torch

    from edgedyn.frontend.inputs import TensorSpec

    try:
        program = torch.export.load(str(path))
    except Exception as error:
        raise CaptureError("cannot read {} as a saved ExportedProgram: {}".format(
            path, (str(error).strip().splitlines() or [type(error).__name__])[0]),
            hint="write it with torch.export.save(torch.export.export(model, args), '{}')".format(path.name)) from error
    placeholders = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    user_inputs = list(program.graph_signature.user_inputs)

    def examples() -> Dict[str, Any]:
        values = {}
        for name in user_inputs:
            value = placeholders.get(name)
            if not hasattr(value, "shape") or not all(isinstance(s, int) for s in value.shape):
                raise CaptureError("{} input '{}' has no fixed shape recorded".format(path.name, name),
                                   hint="give its shape: --input {}=1x3x224x224".format(name))
            values[name] = TensorSpec(tuple(value.shape), str(value.dtype).replace("torch.", ""))
        return values

    return program.module(), examples


def _load_onnx(path: Path) -> Tuple[Any, Callable[[], Any]]:
    from edgedyn.frontend.onnx_import import load_onnx

    return load_onnx(path)


# Model files read without Python code of the user's: suffix -> (model, example inputs function).
FILE_LOADERS = {".onnx": _load_onnx, ".pt2": _load_program}  # type: Dict[str, Callable[[Path], Tuple[Any, Any]]]


def resolve_model(obj: Any, label: str) -> Any:
    """An nn.Module class is instantiated, a zero-argument factory called; modules and functions pass through."""
    import torch

    if isinstance(obj, torch.nn.Module):
        return obj
    if inspect.isclass(obj):
        if not issubclass(obj, torch.nn.Module):
            raise CaptureError("{} is a class but not a torch.nn.Module".format(label))
        try:
            return obj()
        except TypeError as error:
            raise CaptureError(
                "cannot construct {} without arguments: {}".format(label, error),
                hint="add a zero-argument factory function to the model file and name it instead",
            )
    if not callable(obj):
        raise CaptureError("{} is neither an nn.Module nor a function".format(label))
    if _required_parameters(obj) == 0:
        built = obj()
        if not callable(built):
            raise CaptureError("factory {} returned {}, not a model".format(label, type(built).__name__))
        return built
    return obj


def _required_parameters(function: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return -1
    return sum(1 for p in parameters if p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _import_file(path: Path) -> Any:
    resolved = path.resolve()
    name = "edgedyn_user_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, str(resolved))
    if spec is None or spec.loader is None:
        raise CaptureError("cannot import {} as Python".format(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(resolved.parent))  # so the model file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        line = getattr(error, "lineno", None) if isinstance(error, SyntaxError) else None
        raise CaptureError("importing {} failed: {}: {}".format(path, type(error).__name__, error),
                           hint="fix {}{} and check it with `python3 {}`".format(
                               path, ":{}".format(line) if line else "", path)) from error
    finally:
        sys.path.remove(str(resolved.parent))
    return module
