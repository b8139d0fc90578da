"""Pipeline parallelism: ``analysis`` splits a model into stages as torch.distributed.pipelining
does and counts each with a counter per stage (`count_pipeline`), ``schedules`` holds torch's
schedule orders and the step's timeline, ``mesh`` a pipeline on the (pp, fsdp, tp) mesh (a
stage's rank standing for its group, the built-in Llama's stages), ``slices`` a whole model's
rank cut into the stages, and ``ranks`` the public `analyze_pipeline` (the stages given, or a
`Layout`: the pipeline composed with tp and fsdp, what `analyze_ranks` calls);
``stage_memory`` a pipeline rank's step memory (what `memory_ranks` calls with ``pp``).
"""

from .analysis import layer_split_points
from .ranks import analyze_pipeline

__all__ = ["analyze_pipeline", "layer_split_points"]
