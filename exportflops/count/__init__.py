"""Count: the formula table applied to walked nodes.

``apply`` gives one `NodeRecord` per node (never a silent zero), ``decompose`` counts an op with
no formula through torch's decomposition of it, ``backward`` finds the ops autograd runs for
each forward node in train mode, and ``replay`` runs one op on fresh fake tensors to record them.
"""
