"""Graph passes: each a plain function over the unlifted fx.GraphModule, run in the order listed here."""
from typing import Callable, Dict, List

import torch
from torch import fx

from edgedyn.errors import EdgedynError
from edgedyn.passes.batchnorm import fold_batchnorm
from edgedyn.passes.constant_folding import fold_constants
from edgedyn.passes.dead_code import remove_dead_code
from edgedyn.passes.decompose import decompose_to_core_aten
from edgedyn.passes.graph import reexport

Pass = Callable[[fx.GraphModule], fx.GraphModule]

PIPELINES = {
    "default": [decompose_to_core_aten, fold_batchnorm, fold_constants, remove_dead_code],
    "none": [],
}  # type: Dict[str, List[Pass]]


def run_pipeline(program: "torch.export.ExportedProgram", name: str = "default") -> "torch.export.ExportedProgram":
    """Runs the named pipeline over a captured program and returns it in core ATen, ready for a backend."""
    if name not in PIPELINES:
        raise EdgedynError("unknown pass pipeline '{}'; choose from: {}".format(name, ", ".join(sorted(PIPELINES))))
    args = tuple(program.example_inputs[0]) if program.example_inputs else None
    gm = program.module()
    for graph_pass in PIPELINES[name]:
        gm = graph_pass(gm)
    if args is None:
        from edgedyn.passes.graph import example_args

        args = example_args(gm)
    return reexport(gm, args)
