"""The package version and the torch releases it is tested on, in a module of its own so that
any module (and ``exportflops --version``) can read them without importing torch."""

from __future__ import annotations

from importlib import metadata

__version__ = "0.1.0"

#: The torch releases the test suite runs on: the whole suite on the first, the core subset
#: (tests/core_subset.txt) on each.
TESTED_TORCH = ("2.13.0", "2.14.1", "2.15.0")


def is_tested_torch(version: str) -> bool:
    """Whether torch ``version`` (its local tag such as ``+cpu`` aside) is one the suite runs on."""
    return version.split("+")[0] in TESTED_TORCH


def versions_text() -> str:
    """What ``exportflops --version`` prints: this package's version, torch's (as torch itself
    says it, with its build tag such as ``+cpu``) and transformers' (from its metadata, without
    importing it), and whether the suite runs on this torch."""
    torch_version = _torch_version()
    tested = ("one the test suite runs on" if torch_version and is_tested_torch(torch_version)
              else f"not one the test suite runs on ({', '.join(TESTED_TORCH)})")
    return (f"exportflops {__version__}\n"
            f"torch {torch_version or 'not installed'} ({tested})\n"
            f"transformers {_installed('transformers') or 'not installed'}")


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def _installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
