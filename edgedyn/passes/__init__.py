"""Graph passes: each a plain function over the unlifted fx.GraphModule, run in the order listed here."""
from typing import Callable, Dict, FrozenSet, List

import torch
from torch import fx

from edgedyn.errors import EdgedynError
from edgedyn.passes.batchnorm import fold_batchnorm
from edgedyn.passes.branches import merge_parallel_convolutions
from edgedyn.passes.constant_folding import fold_constants
from edgedyn.passes.dead_code import remove_dead_code
from edgedyn.passes.decompose import decompose_to_core_aten
from edgedyn.passes.indexing import index_put_to_where, index_to_views
from edgedyn.passes.graph import reexport

Pass = Callable[[fx.GraphModule], fx.GraphModule]

PIPELINES = {
    "default": [decompose_to_core_aten, fold_batchnorm, merge_parallel_convolutions, fold_constants, index_to_views,
                index_put_to_where, remove_dead_code],
    # For onnxruntime (its Backend record names this pipeline): torch's ONNX exporter lowers the high-level ops
    # itself, into the patterns onnxruntime fuses (LayerNormalization, Gelu, SkipLayerNormalization, MatMul+Add);
    # after core-ATen decomposition those fusions no longer match (BERT-tiny: 2 Gelu, 3 Add left unfused).
    # onnxruntime folds batch norm and constants itself (the backend's offline basic optimizations); no runtime
    # merges parallel convolutions (OpenVINO's fp32 on FastViT-T8: 10.4 ms as timm builds it, 9.2 reparameterized).
    "onnxruntime": [merge_parallel_convolutions, remove_dead_code],
    "none": [],
}  # type: Dict[str, List[Pass]]
# Pipelines whose result keeps torch's high-level ops (aten.gelu, aten.layer_norm, scaled_dot_product_attention)
# instead of core ATen: only for backends whose own exporter lowers those.
HIGH_LEVEL = frozenset({"onnxruntime"})  # type: FrozenSet[str]


def pipeline_passes(name: str) -> List[str]:
    """The names of a pipeline's passes, for the manifest."""
    return [graph_pass.__name__ for graph_pass in PIPELINES[name]]


def run_pipeline(program: "torch.export.ExportedProgram", name: str = "default") -> "torch.export.ExportedProgram":
    """Runs the named pipeline over a captured program and returns it in core ATen (or, for the HIGH_LEVEL ones,
    with torch's high-level ops kept), ready for a backend."""
    if name not in PIPELINES:
        raise EdgedynError("unknown pass pipeline '{}'; choose from: {}".format(name, ", ".join(sorted(PIPELINES))))
    args = tuple(program.example_inputs[0]) if program.example_inputs else None
    gm = program.module()
    for graph_pass in PIPELINES[name]:
        gm = graph_pass(gm)
    if args is None:
        from edgedyn.passes.graph import example_args

        args = example_args(gm)
    if name in HIGH_LEVEL:
        from edgedyn.torch_quiet import quiet_torch

        with quiet_torch():
            return torch.export.export(gm, args, strict=False)
    return reexport(gm, args)
