"""``python benchmarks/run.py``: the same as ``python -m benchmarks`` (see there)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.__main__ import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
