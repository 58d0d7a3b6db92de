from torch import fx

from edgedyn.passes.graph import remove_unused_attributes


def remove_dead_code(gm: fx.GraphModule) -> fx.GraphModule:
    """Removes operators whose results are never used, then the weights nothing reads."""
    # Note: torch.export's unlifted module calls a `_guards_fn` submodule that re-checks input shapes; the
    # bundle's guards do that job on the board, and the call would otherwise keep dead inputs alive.
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    remove_unused_attributes(gm)
    gm.recompile()
    return gm
