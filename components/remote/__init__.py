"""Scripts that run on the nodes, inside the Ray head container or (the preflight probe) on the node itself.

They are sent over SSH on stdin.
"""

import shlex
from pathlib import Path

_HERE = Path(__file__).parent


def script(name: str) -> str:
    return (_HERE / name).read_text()


def with_progress(name: str) -> str:
    """A Python script that moves artifacts, after the helpers it prints with (progress.py)."""
    return script("progress.py") + "\n\n" + script(name)


def docker_exec(container: str, argv: list[str]) -> str:
    """A shell command that runs `argv` inside `container` with stdin attached (for scripts sent on stdin)."""
    return shlex.join(["docker", "exec", "-i", container, *argv])


def bounded(command: str, seconds: int) -> str:
    """`command` killed after `seconds` on the node: pulumi-command enforces no timeout (its session ignores
    customTimeouts and Ctrl-C), so a hung SSH session or `docker exec` would otherwise wait forever."""
    return f"timeout -k 10 {seconds} {command}"
