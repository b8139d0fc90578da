"""The trainer libraries are optional (``pip install 'exportflops[trainers]'``): the core never
imports them, and an integration that needs one says how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingExtraError


def trainer_library(module: str, integration: str) -> ModuleType:
    """The module ``module`` (``transformers``, ``lightning.pytorch``), or a `MissingExtraError`
    naming ``integration`` and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            f"{integration} needs {module.split('.')[0]}, which is not installed ({error}). "
            f"Install the extra: pip install 'exportflops[trainers]'.") from None
