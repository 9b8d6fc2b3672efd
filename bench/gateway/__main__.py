"""``python -m bench.gateway``: the gateway side by side (``bench.gateway.side_by_side``)."""

from __future__ import annotations

import sys

from bench.gateway.side_by_side import main

if __name__ == "__main__":
    sys.exit(main())
