"""``riffle`` on PATH after ``pip install``: the daemon binary in the wheel."""

from __future__ import annotations

import os
import sys

from .daemon import find_binary


def main() -> None:
    binary = find_binary()
    os.execv(binary, [binary, *sys.argv[1:]])
