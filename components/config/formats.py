"""What a well-formed value is, for values that would otherwise fail only on a node, during `up`.

Each rule follows the tool that consumes the value (Docker, the kernel, OpenSSH, the shell), so a value refused
here is one that tool would have refused later, or read as something else.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

# POSIX environment names: letters, digits and `_`, not starting with a digit. Docker splits `NAME=value` at the
# first `=`, so a key `FOO=BAR` silently becomes FOO with the value `BAR=...`.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)

# User names: POSIX's portable set (letters, digits, `.`, `_`, `-`), starting with a letter or `_` as Debian's and
# Ubuntu's adduser require (a leading `-` would read as an option), at most 32 characters (utmp's limit). No `$`:
# names ending in it are Samba machine accounts, which do not log in. The set holds no shell metacharacter, which
# OpenSSH 9.6 also refuses in a user name given on its command line.
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", re.ASCII)

# Linux interface names: 1-15 bytes (IFNAMSIZ), no `/`, `:` or whitespace; iptables and NCCL take them as given.
INTERFACE = re.compile(r"(?!\.\.?$)[^/:\s]{1,15}", re.ASCII)

# Docker image references (distribution's grammar): an optional registry host, lower-case path components, then an
# optional tag and digest. Docker refuses `nvcr.io/NVIDIA/vllm` or `Vllm:1` with "repository name must be lowercase",
# and a space anywhere with "invalid reference format".
_HOST_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_REGISTRY = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(rf"(?:{_REGISTRY}/)?{_PATH_PART}(?:/{_PATH_PART})*(?::\w[\w.-]{{0,127}})?"
                   r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?", re.ASCII)

# pulumi-docker hands `gpus` to Docker's own parser, which reads it as CSV: `device=0,1` is then a device and a
# count, which the daemon refuses together, so several devices need the inner quotes Docker documents.
GPUS = re.compile(r'all|none|[1-9][0-9]{0,2}|device=[\w:-]+|"device=[\w:-]+(?:,[\w:-]+)*"', re.ASCII)

# vLLM's load formats are lower-case names with `_` (auto, fastsafetensors, runai_streamer_sharded); which ones an
# image's vLLM has, and whether their packages import, is preflight's to read from the image.
LOAD_FORMAT = re.compile(r"[a-z][a-z0-9_]{0,63}", re.ASCII)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_character(value: str) -> str | None:
    """The first control character in `value`, spelled as Python would (\\n, \\x1b), or None."""
    found = _CONTROL.search(value)
    return None if found is None else repr(found.group())[1:-1]


def normal_absolute_path(value: Any) -> bool:
    """An absolute path as the kernel resolves it, and as written: no `~` (no shell expands it on the node), no `..`,
    no doubled or trailing `/`, no surrounding spaces (Docker mounts the path with them)."""
    return (isinstance(value, str) and value.startswith("/") and not value.startswith("//")
            and posixpath.normpath(value) == value and value == value.strip() and control_character(value) is None)


def fullmatch(pattern: re.Pattern, value: Any) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None and len(value) <= 255
