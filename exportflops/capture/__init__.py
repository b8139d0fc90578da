"""Capture: every tracer of the package, so a torch upgrade touches this folder.

``export`` is the only caller of ``torch.export`` (a model, an ExportedProgram or a saved
``.pt2`` in, a `Captured` program out), with ``draft_mends`` for deciding branches by values and
``saved`` for programs read back; ``blocks`` (with ``call_keys`` and ``cheap_ops``) and
``fastpath`` are the fast path's cheap eager pass and its export with repeated blocks stubbed;
``shape_kernels`` makes the outputs of common ops from their shapes while exporting with
dynamic sizes (torch's program, found faster);
``dtensor`` and ``fsdp`` capture one rank of a parallelized model. ``hints`` turns torch's
failures into the user's next step, ``placement`` checks where the inputs live, ``quiet``
silences torch's logs while a capture falls back, and ``dims`` makes named dynamic sizes
(``batch``, ``seq``) the ``dynamic_shapes`` an export takes; ``held`` finds every tensor a
call's inputs hold (a filled cache's, in objects pytree does not know) and copies the inputs
with each one replaced (the fake copy of a step).
"""
