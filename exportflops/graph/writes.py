"""Which node holds a tensor's value where a later op reads it, after in-place writes.

make_fx gives the users after an in-place op the op's own node (``linear(relu_, w)`` after
``h.relu_()``), but a write through a view gives only that view the new node: after
``buf[..., :n] = k`` (``slice`` then ``copy_``) the ops reading ``buf`` still name the node that
made it, the value before the write. Transformers' DeepSeek-V3 attention builds its keys so
(``new_empty``, then the no-rope and rope parts copied into slices): the graph's SDPA reads
``new_empty``, which computes nothing from the model's weights, while autograd differentiates
through the writes (``CopySlices``). The backward's gradient flow reads each input through
`current_values` to see what autograd sees.
"""

from __future__ import annotations

import operator

import torch.fx

from .kinds import aliased_input, view_root, written_inputs


def current_values(graph: torch.fx.Graph) -> dict[tuple[torch.fx.Node, torch.fx.Node],
                                                   torch.fx.Node]:
    """(user, input) -> the in-place op whose result ``user`` reads where the graph names
    ``input``: the last op before ``user`` writing into the storage ``input`` views, when it
    ran after ``input`` was made. Pairs that read the value as named are absent."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    sources = {node: source for node in graph.nodes if (source := _view_source(node)) is not None}
    last_write: dict[torch.fx.Node, torch.fx.Node] = {}
    current = {}
    for node in graph.nodes:
        for read in node.all_input_nodes:
            writer = last_write.get(view_root(read, sources))
            if writer is not None and order[writer] > order[read]:
                current[(node, read)] = writer
        for written in written_inputs(node):
            last_write[view_root(written, sources)] = node
    return current


def _view_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node whose storage ``node`` shares: a view's (or an in-place op's) input, an element
    of a list of views (``split``); not an element of an op returning new tensors (``max``)."""
    source = aliased_input(node)
    if node.target is operator.getitem and source is not None:
        schema = getattr(source.target, "_schema", None)
        if schema is None or not schema.returns or schema.returns[0].alias_info is None:
            return None
    return source

