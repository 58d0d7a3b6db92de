"""Finds the user's model: `path/to/model.py:Name` -> an nn.Module or a plain function."""
import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

from edgedyn.errors import CaptureError


def load_reference(reference: str) -> Tuple[Any, Optional[Callable[[], Any]], str]:
    """Resolves `file.py:name` to (model or function, the file's `example_inputs` if any, the name)."""
    path_text, _, attribute = reference.rpartition(":")
    if not path_text or not attribute:
        raise CaptureError(
            "cannot read model reference {!r}".format(reference),
            hint="write it as path/to/model.py:Name, e.g. examples/tiny_cnn.py:TinyCNN",
        )
    path = Path(path_text)
    if not path.is_file():
        raise CaptureError("model file {} does not exist".format(path), hint="check the path before the ':'")
    module = _import_file(path)
    if not hasattr(module, attribute):
        names = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                       and getattr(v, "__module__", None) == module.__name__)
        raise CaptureError(
            "{} has no attribute {!r}".format(path, attribute),
            hint="names defined there: {}".format(", ".join(names) or "(none)"),
        )
    examples = getattr(module, "example_inputs", None)
    return resolve_model(getattr(module, attribute), reference), examples if callable(examples) else None, attribute


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
