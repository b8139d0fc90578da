"""Runtime: measured latency per node and module, beside the counts.

``measure`` holds `profile` (replay the exported graph with a clock around each node),
``timing`` the timing engine, ``measured`` the `RuntimeProfile` record built from samples, and
``profiler`` `FlopsProfiler`, DeepSpeed's profiler interface over `profile`.
"""

from .measure import profile

__all__ = ["profile"]
