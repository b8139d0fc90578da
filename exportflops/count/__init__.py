"""Count: the formula table applied to walked nodes.

``apply`` gives one `NodeRecord` per node (never a silent zero), ``decompose`` counts an op with
no formula through torch's decomposition of it, ``backward`` finds the ops autograd runs for
each forward node in train mode, ``replay`` runs one op on fresh fake tensors to record them,
and ``ranks`` counts one rank of a parallelized model: the process group it runs in
(`fake_process_group`), its local shards and the collectives it issues (every count asks
`is_parallelized`).
"""
