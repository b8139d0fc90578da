"""Graph: the readers of ``node.meta`` outside capture.

``walk`` turns each ``call_function`` node of an exported graph into a `NodeCall` (the op, its
tensors' shapes, its module stack); ``stacks`` reads module stacks, ``kinds`` what each tensor
holds (weight, state, activation), ``writes`` which in-place write a later op reads
through a view, ``vmap`` how often an op under ``torch.vmap`` runs,
``flex_blocks`` the scores a flex attention's block mask skips, ``eager_heads`` the key/value
heads an eager transformers attention call passes where its graph repeats them,
``program_edits`` the edits generation makes to a decode step's program, and ``passes`` a
parallelized rank's backward in the input and weight passes of torch's zero-bubble schedules.
"""
