"""``python -m turboinfer_llama.server``: the same as ``turboinfer serve``."""

from __future__ import annotations

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
