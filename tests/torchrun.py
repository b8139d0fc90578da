"""Starting a worker script on two local gloo processes with torchrun, bounded in time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: Path, *args: str, ranks: int = 2,
             timeout: int = 180) -> subprocess.CompletedProcess:
    """``script`` with ``args`` on ``ranks`` processes of this machine (localhost only)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script),
               *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
