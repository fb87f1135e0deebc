"""deepline as an install has it: its modules' bytecode compiled once (pip does it when it
installs a package), so a benchmark's processes do not each compile ~100 modules first. An
editable install under PYTHONDONTWRITEBYTECODE=1 would, and that time is not deepline's."""

from __future__ import annotations

import compileall
from pathlib import Path

import deepline_cli


def compiled() -> None:
    compileall.compile_dir(str(Path(deepline_cli.__file__).parent), quiet=1)
