"""Where tvm-hetero keeps what it measured or asked once (kernel costs, a vendor's answers, device
cost tables): one folder, ``$TVM_HETERO_CACHE``, else ``$XDG_CACHE_HOME/tvm-hetero``, else
``~/.cache/tvm-hetero``. (The emulated board's prepared root is not a cache of answers: it has its
own ``$TVM_HETERO_BOARD_DIR``, which scripts/board.sh shares.)"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The folder (not created here)."""
    if os.environ.get("TVM_HETERO_CACHE"):
        return Path(os.environ["TVM_HETERO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tvm-hetero"
