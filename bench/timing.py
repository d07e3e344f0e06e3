"""Timing: a command run with its output lines and engine events stamped as they arrive, and summary stats."""

from __future__ import annotations

import json
import resource
import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


def host_cpu_s() -> float:
    """CPU seconds this machine has spent busy (every core, every process: the lab's nodes are processes of this
    kernel), from /proc/stat: a difference of two readings is what an operation cost the machine."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Timed:
    returncode: int
    seconds: float
    lines: list[tuple[float, str]]  # (seconds since start, output line)
    events: list[tuple[float, dict]] = field(default_factory=list)  # (seconds since start, engine event)
    cpu_s: float = 0.0  # the machine's busy CPU seconds while it ran
    tree_cpu_s: float = 0.0  # of them, the command's own and its descendants' (the engine, program, plugins, ssh)

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)


def run(cmd: list[str], cwd: Path, env: dict[str, str], event_log: Optional[Path] = None,
        timeout: float = 900) -> Timed:
    """Runs `cmd` to its end. The event log's own timestamps have 1 s resolution, so lines are stamped on
    arrival by polling the file while the engine writes it."""
    start, cpu, tree = time.monotonic(), host_cpu_s(), _children_cpu_s()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []

    def read_output():
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    events: list[tuple[float, dict]] = []
    tail = _Tail(event_log) if event_log else None
    try:
        while proc.poll() is None:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{' '.join(cmd)} took more than {timeout:g} s")
            if tail:
                events += [(time.monotonic() - start, e) for e in tail.read()]
            time.sleep(0.05)
    except BaseException:
        # A `pulumi` left running holds the stack's lock, and the caller's clean-up `destroy` would be refused.
        proc.kill()
        proc.wait()
        raise
    seconds, cpu = time.monotonic() - start, host_cpu_s() - cpu
    reader.join()
    if tail:
        events += [(seconds, e) for e in tail.read()]
    return Timed(proc.returncode, seconds, lines, events, cpu, _children_cpu_s() - tree)


def _children_cpu_s() -> float:
    """CPU seconds of this process's waited-for descendants: each waits for its own children, so a `pulumi`
    command's reading covers its plugins and their ssh clients too (not an ssh master left running)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class _Tail:
    """The events in the complete lines appended to a file since the last read. The file may be started anew
    (it is read again from its start) and a line may hold more than one event or a torn one: bookkeeping must
    never end the run it times."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, ""

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        if self.path.stat().st_size < self.offset:
            self.offset, self.partial = 0, ""
        with self.path.open() as f:
            f.seek(self.offset)
            chunk = f.read()
            self.offset = f.tell()
        text = self.partial + chunk
        *complete, self.partial = text.split("\n")
        return [event for line in complete for event in _objects(line)]


def _objects(line: str) -> list[dict]:
    """Every whole JSON object on `line`, in order; what cannot be read ends the line."""
    decoder, found, at = json.JSONDecoder(), [], 0
    line = line.strip()
    while at < len(line):
        try:
            obj, at = decoder.raw_decode(line, at)
        except json.JSONDecodeError:
            break
        found.append(obj)
        while at < len(line) and line[at].isspace():
            at += 1
    return found


def stats(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "samples": [round(s, 3) for s in samples]}


def ratios(numerators: list[float], denominators: list[float]) -> dict:
    """Pair by pair (repetition i with repetition i of the same run): the noise of one moment cancels."""
    return stats([n / d for n, d in zip(numerators, denominators)])
