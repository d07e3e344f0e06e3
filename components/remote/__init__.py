"""Scripts that run on the nodes, inside the Ray head container or (the preflight probe) on the node itself.

They are sent over SSH on stdin.
"""

import shlex
from pathlib import Path

_HERE = Path(__file__).parent


def script(name: str) -> str:
    return (_HERE / name).read_text()


def docker_exec(container: str, argv: list[str]) -> str:
    """A shell command that runs `argv` inside `container` with stdin attached (for scripts sent on stdin)."""
    return shlex.join(["docker", "exec", "-i", container, *argv])

