"""The plain text the program and scripts/status print: aligned tables, sizes, the line that says what went wrong."""

from __future__ import annotations

from typing import Sequence


def table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Rows in columns two spaces apart, each as wide as its widest cell; the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join((indent + "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]])).rstrip()
                     for row in rows)


def size(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB, with one decimal above bytes."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def last_line(text: str, empty: str = "(no output)") -> str:
    """The last line that is not blank, stripped: where a failing command says why."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else empty


def duration(seconds: float) -> str:
    """A rough age: 35 s, 4 min, 3 h, 2 d."""
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds // length:.0f} {unit}"
    return f"{seconds:.0f} s"
