"""A stand-in for the ``sglang`` package, for tests (see ``llmroute/testing/_sglang.py``).

``__version__`` comes from ``SGLANG_STANDIN_VERSION`` (default "0.5.5"). Importing this package
imports nothing else, so ``python -c "import sglang; print(sglang.__version__)"`` is fast.
``sglang.cli`` (the ``sglang serve`` command) exists from 0.5.5 on, as in the real releases.
"""

import os
import re

__version__ = os.environ.get("SGLANG_STANDIN_VERSION") or "0.5.5"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(m) for m in re.findall(r"^\d+|(?<=\.)\d+", text)[:3])


if _version_tuple(__version__) >= (0, 5, 5):
    __path__.append(os.path.join(os.path.dirname(__file__), "_since_0_5_5"))
