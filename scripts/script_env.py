"""What the scripts that read a stack (status, logs, bench-serve) need first: the project's virtualenv, in which
each runs itself again, and the Pulumi CLI on PATH. Beside them, so that each imports it from its own folder before
it knows the project's; standard library only, as it runs before the virtualenv does."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def enter(name: str, script: str, project: Path) -> None:
    """Runs `script` again in `project`'s virtualenv unless it already runs there; exits, naming `name`, with what to
    do when the virtualenv or `pulumi` is missing."""
    venv = project / ".venv"
    if Path(sys.prefix).resolve() != venv.resolve():
        python = venv / "bin" / "python"
        if not python.exists():
            sys.exit(f"{name}: no virtualenv at {venv}; run `pulumi install` first")
        os.execv(python, [str(python), script, *sys.argv[1:]])
    if shutil.which("pulumi") is None:
        sys.exit(f"{name}: no `pulumi` on PATH: for the lab's stacks, `. ~/.cache/spark-vllm/try-lab/lab.env` first "
                 "(scripts/try-lab writes it); elsewhere, scripts/install-pulumi prints where it put the CLI")
