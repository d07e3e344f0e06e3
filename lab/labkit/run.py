"""Bounded subprocess calls, bounded polling, and per-phase timing for the lab commands."""
import contextlib
import subprocess
import sys
import time


class LabError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[lab] {msg}", flush=True)


def run(args, *, input=None, timeout=120, check=True, stdin=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
    """Run a command (never through a shell) with a hard timeout; raise LabError with its stderr on failure."""
    try:
        proc = subprocess.run(args, input=input, stdin=stdin, stdout=stdout, stderr=stderr,
                              text=input is None or isinstance(input, str), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LabError(f"timed out after {timeout}s: {' '.join(map(str, args))}") from None
    if check and proc.returncode != 0:
        err = proc.stderr or ""
        err = err if isinstance(err, str) else err.decode(errors="replace")
        raise LabError(f"exit {proc.returncode}: {' '.join(map(str, args))}\n{err.strip()[-3000:]}")
    return proc


def run_logged(args, logfile, *, timeout: int) -> None:
    """Run a long step with stdout and stderr in logfile; on failure the error quotes the log's tail."""
    with open(logfile, "w") as lf:
        try:
            run(args, stdout=lf, stderr=subprocess.STDOUT, timeout=timeout)
        except LabError as e:
            tail = "\n".join(open(logfile, errors="replace").read().splitlines()[-40:])
            raise LabError(f"{str(e).splitlines()[0]}\n--- last lines of {logfile}:\n{tail}") from None


def out(args, **kw) -> str:
    return run(args, **kw).stdout.strip()


def ok(args, timeout=30) -> bool:
    try:
        return run(args, timeout=timeout, check=False).returncode == 0
    except LabError:
        return False


def wait_until(predicate, *, timeout: float, what: str, interval: float = 0.5):
    """Poll predicate until it returns a truthy value; LabError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Phases:
    """Times named phases and prints each as it ends, plus a summary table."""

    def __init__(self):
        self.done: list[tuple[str, float]] = []
        self.start = time.monotonic()

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.monotonic()
        log(f"{name} ...")
        try:
            yield
        finally:
            dt = time.monotonic() - t0
            self.done.append((name, dt))
            log(f"{name}: {dt:.1f}s")

    def summary(self, title: str) -> None:
        width = max([len(n) for n, _ in self.done] + [5])
        print(f"\n{title} timings", flush=True)
        for name, dt in self.done:
            print(f"  {name:<{width}}  {dt:7.1f}s")
        print(f"  {'total':<{width}}  {time.monotonic() - self.start:7.1f}s", flush=True)


def fail(msg: str) -> None:
    print(f"[lab] error: {msg}", file=sys.stderr, flush=True)
