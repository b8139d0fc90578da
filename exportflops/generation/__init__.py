"""Generation: the prefill and one decode step, as polynomials of the context length.

``decoder`` holds `analyze_generation` for decoder-only models, ``seq2seq`` the encoder-decoder
models, ``sliding`` the caches whose layers keep a window, ``limits`` the positions a request
needs against those the model holds, ``cache_names`` the name transformers gives a model's
cache, ``forked`` work run in a forked process meanwhile, and ``footprint`` the memory of the
prefill and decode steps (`generation_memory`).
"""

from .decoder import analyze_generation
from .footprint import generation_memory

__all__ = ["analyze_generation", "generation_memory"]
