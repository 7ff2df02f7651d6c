"""The command line starts without the heavy libraries: `prefixlab --help` must not pay
for matplotlib (figures) or numba (compiled kernels), which load on first use."""

from __future__ import annotations

import subprocess
import sys


def test_cli_import_leaves_matplotlib_and_numba_unloaded() -> None:
    code = (
        "import sys, prefixlab.cli.main; "
        "print(sorted(m for m in ('matplotlib', 'numba', 'torch', 'sklearn', 'pyarrow') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
