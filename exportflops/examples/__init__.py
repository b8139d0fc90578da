"""Built-in example models, constructed with no download.

Each example is a factory ``(device="meta", ...) -> (model, args)``; the CLI and the README's
first command run them by name.
"""

from __future__ import annotations

from .gpt2 import gpt2
from .llama import llama
from .resnet import resnet50

EXAMPLES = {"gpt2": gpt2, "llama": llama, "resnet50": resnet50}
