"""The package's import structure: layers only import downwards, and no module imports itself round a circle.

Read from the source with `ast` (nothing is imported), counting every import: module level and inside functions,
except those under `if TYPE_CHECKING:`, which never run. docs/architecture.md shows the same layers.
"""
import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgedyn"

# Note: the layers, lowest first; keep docs/architecture.md in step. A module may import its own layer and those
# below it. The longest matching prefix decides; a prefix ending in "=" names that module alone, not its submodules.
LAYERS: List[Tuple[str, Tuple[str, ...]]] = [
    ("runtime", ("edgedyn.runtime",)),  # on the board: imports nothing else from edgedyn
    ("base", ("edgedyn.errors", "edgedyn.torch_quiet", "edgedyn.version", "edgedyn._schema")),
    ("registry", ("edgedyn.registry",)),
    ("boards", ("edgedyn.boards",)),
    ("emulate", ("edgedyn.emulate",)),  # the emulated board, host side: `auto` for another board measures there
    ("capture", ("edgedyn.frontend", "edgedyn.zoo")),
    ("passes", ("edgedyn.passes", "edgedyn.calibration")),
    ("quantize", ("edgedyn.quantize",)),
    ("backends", ("edgedyn.backends",)),
    ("choice", ("edgedyn.selection", "edgedyn.candidates", "edgedyn.onboard", "edgedyn.layer_probe", "edgedyn.turns",
                "edgedyn.fit", "edgedyn.bundle")),
    ("export", ("edgedyn.exporter",)),
    ("fleet", ("edgedyn.fleet",)),  # boards over TVM's RPC tracker, and tuning
    ("interface", ("edgedyn.cli", "edgedyn.__main__", "edgedyn=")),
]
# Modules a layer may import from a higher one, each with its reason. Keep this empty if you can.
ALLOWED_UPWARD: Dict[Tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> Dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    matches = []  # (length of the matching prefix, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix.endswith("=")
            name = prefix.rstrip("=")
            if module == name or (not exact and module.startswith(name + ".")):
                matches.append((len(name) + exact, index))
    if matches:
        return max(matches)[1]
    raise AssertionError("module {} is in no layer of tests/test_architecture.py LAYERS: add it there and to "
                         "docs/architecture.md".format(module))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, modules: Set[str]) -> Set[str]:
    """The edgedyn modules `module` imports anywhere in its source (resolved to modules, not names in them)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()  # type: Set[str]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = "{}.{}".format(base, alias.name)
                found.add(candidate if candidate in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name in modules}


@pytest.fixture(scope="module")
def graph() -> Dict[str, Set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def test_every_module_is_in_a_layer(graph):
    for module in graph:
        layer_of(module)


def test_no_import_runs_up_a_layer(graph):
    upward = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            if layer_of(target) > layer_of(module) and (module, target) not in ALLOWED_UPWARD:
                upward.append("{} ({}) imports {} ({})".format(
                    module, LAYERS[layer_of(module)][0], target, LAYERS[layer_of(target)][0]))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_runtime_imports_only_itself(graph):
    outside = ["{} imports {}".format(m, t) for m, imported in sorted(graph.items()) if m.startswith("edgedyn.runtime")
               for t in sorted(imported) if not t.startswith("edgedyn.runtime")]
    assert not outside, outside


def test_backends_import_neither_selection_nor_exporter(graph):
    wrong = ["{} imports {}".format(m, t) for m, imported in sorted(graph.items()) if m.startswith("edgedyn.backends")
             for t in sorted(imported) if t.split(".")[1] in ("selection", "exporter", "cli")]
    assert not wrong, wrong


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import circle as a list of modules (first == last), or [] when there is none."""
    state = {}  # type: Dict[str, int]  # 1: on the current path, 2: done
    path = []  # type: List[str]

    def visit(module: str) -> List[str]:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return []


def test_no_import_circles(graph):
    cycle = find_cycle(graph)
    assert not cycle, "import circle: " + " -> ".join(cycle)


def test_the_checkers_see_what_they_claim():
    # A planted circle and a planted upward import are found: the tests above can fail.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
    assert layer_of("edgedyn.registry") < layer_of("edgedyn.boards") < layer_of("edgedyn.backends.tvm")
    assert layer_of("edgedyn.quantize.plan") < layer_of("edgedyn.backends.tvm") < layer_of("edgedyn.selection")
    assert layer_of("edgedyn.runtime.format") == 0 and layer_of("edgedyn.cli.main") == len(LAYERS) - 1


def test_a_function_level_import_counts(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from edgedyn.exporter import export\n"
                      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edgedyn.cli import main\n")
    assert imports_of("edgedyn.runtime.mod", source, {"edgedyn.exporter", "edgedyn.cli"}) == {"edgedyn.exporter"}


def test_no_module_is_over_400_lines_without_a_reason():
    # A file over ~400 lines is usually two ideas; one that must stay whole says why in its docstring.
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 400 and "Over 400 lines because" not in text[:3000]:
            long.append("{} ({} lines)".format(path.relative_to(PACKAGE.parent), text.count("\n")))
    assert not long, "split these modules, or say at their top why not ('Over 400 lines because ...'): " + ", ".join(
        long)
