"""Waits for vLLM to serve: the process alive, then /health, then /v1/models listing the served model, then one
completion.

With Ray it runs inside the Ray head container (`python3 - ARGS`, this file on stdin), and follows the serve's
pid file and log file. With mp (`--container`) it runs on the head node, where rank 0 is a container's own
process: alive is the container running, the log is `docker logs`, the API key is in its environment. While it
waits it prints the weight-loading progress read from the vLLM log (shards, tensors or bytes k/N, as the loader
counts, and GB/s), so a long load never looks hung. On failure it says whether the process died or is still
loading, and prints the log tail.
"""

import argparse
import atexit
import ctypes
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

# vLLM's weight-loading bars (model_executor/model_loader/weight_utils.py, and the fastsafetensors package), all
# with bar_format "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [...]". What one step counts, by desc:
# files (shards), batches of files (fastsafetensors: one file a rank), tensors (Run:ai), or bytes (InstantTensor,
# unit_scale with unit_divisor 1024).
BAR = re.compile(r"(?P<desc>(?:Loading|Multi-thread loading) [^:\r\n]*?): +\d+% Completed \| *"
                 r"(?P<n>[\d.]+)(?P<nu>[kMGTPEZY]?)/(?P<t>[\d.]+)(?P<tu>[kMGTPEZY]?) \[")
COUNTS = (("InstantTensor", "bytes"), ("Runai", "tensors"), ("fastsafetensors", "shard batches"))
SCALE = {"": 1, **{u: 1024 ** (i + 1) for i, u in enumerate("kMGTPEZY")}}
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies
MILESTONES = ("Loading weights took", "Application startup complete", "Error", "ERROR", "Traceback")


def load_progress(line):
    """(what a step counts, done, total) of a loading bar's line; None for any other line."""
    m = BAR.search(line)
    if not m:
        return None
    unit = next((u for key, u in COUNTS if key in m.group("desc")), "shards")
    done, total = float(m.group("n")) * SCALE[m.group("nu")], float(m.group("t")) * SCALE[m.group("tu")]
    return unit, done, total


def progress_text(progress, weights, elapsed):
    """"loading weights 17/39 shards" or "… 10.2/155.0 GiB" (MiB below a GiB), then the rate: bytes from the bar
    when it counts bytes, else the checkpoint's size times the fraction done."""
    unit, done, total = progress
    if unit == "bytes":
        scale, name = (2 ** 30, "GiB") if total >= 2 ** 30 else (2 ** 20, "MiB")
        text, read = f"loading weights {done / scale:.1f}/{total / scale:.1f} {name}", done
    else:
        text, read = f"loading weights {done:.0f}/{total:.0f} {unit}", weights * done / total if total else 0
    # A rate over less than a second says nothing; later lines have one.
    rate = f", ~{read / elapsed / 1e9:.2f} GB/s" if elapsed >= 1 else ""
    return text, rate


def api_key(env_file):
    try:
        with open(env_file) as f:
            for line in f:
                if line.startswith("VLLM_API_KEY="):
                    return shlex.split(line.split("=", 1)[1])[0]  # written with shlex.quote
    except OSError:
        pass
    return None


def get(url, key, body=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30 if body else 5) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return None, ""


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(no log: {e})\n"


def fmt(seconds):
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def redraws(text):
    """The lines of a log's text: tqdm redraws with carriage returns, and each redraw is a line for us."""
    return [part for line in text.splitlines() for part in line.split("\r") if part.strip()]


class Container:
    """Rank 0's container, on the head node: its state, its log and its API key, through the node's Docker. The log
    comes from one `docker logs --follow`, read as it is written: the gate's rounds ask Docker nothing more while the
    container runs, where reading the whole log and inspecting the container each round cost two Docker calls."""

    def __init__(self, name):
        self.name, self.pending = name, b""
        # Ended with the gate (PR_SET_PDEATHSIG, and close()), or it would follow the log as long as the serve runs.
        self.follower = subprocess.Popen(["docker", "logs", "--follow", name], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         preexec_fn=lambda: ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM))
        assert self.follower.stdout is not None
        self.fd = self.follower.stdout.fileno()
        os.set_blocking(self.fd, False)

    def inspect(self):
        done = subprocess.run(["docker", "inspect", "-f", "{{json .}}", self.name], capture_output=True, text=True,
                              timeout=30)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def alive(self):
        # The follower ends when the container stops: only then is Docker asked.
        if self.follower.poll() is None:
            return True
        info = self.inspect()
        return bool(info and info["State"].get("Running"))

    def api_key(self):
        info = self.inspect() or {"Config": {}}
        env = dict(e.split("=", 1) for e in info["Config"].get("Env") or [] if "=" in e)
        return env.get("VLLM_API_KEY")

    def new_lines(self):
        try:
            while chunk := os.read(self.fd, 65536):
                self.pending += chunk
        except BlockingIOError:
            pass  # all that was written so far
        end = max(self.pending.rfind(b"\n"), self.pending.rfind(b"\r")) + 1  # up to the last line end
        fresh, self.pending = self.pending[:end].decode(errors="replace"), self.pending[end:]
        return redraws(fresh)

    def tail(self, n=40):
        done = subprocess.run(["docker", "logs", "--tail", str(n), self.name], capture_output=True, text=True,
                              timeout=60)
        return done.stdout + done.stderr

    def close(self):
        self.follower.kill()
        self.follower.wait()


class LogFollower:
    def __init__(self, path):
        self.path, self.pos = path, 0

    def new_lines(self):
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return []
        complete = data[: data.rfind("\n") + 1]
        self.pos += len(complete.encode())
        return redraws(complete)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--node", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--model-path", required=True)
    p.add_argument("--log")
    p.add_argument("--pid-file")
    p.add_argument("--env-file")
    p.add_argument("--container", help="mp: rank 0's container, on this node")
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--heartbeat", type=float, default=30)
    a = p.parse_args()
    start = time.monotonic()
    deadline = start + a.timeout
    log: "Container | LogFollower"
    if a.container:
        rank0 = log = Container(a.container)
        atexit.register(rank0.close)
        key, what, log_name = rank0.api_key(), f"container {a.container}", f"`docker logs {a.container}`"
        is_alive, log_tail = rank0.alive, (lambda: rank0.tail())
    else:
        key = api_key(a.env_file)
        with open(a.pid_file) as f:
            pid = int(f.read().strip())
        log = LogFollower(a.log)
        what, log_name = f"pid {pid}", a.log
        is_alive, log_tail = (lambda: alive(pid)), (lambda: tail(a.log))
    # With mp the weights are on the node (mounted at the same path); with Ray, inside the head container.
    weights = sum(os.path.getsize(s) for s in glob.glob(os.path.join(a.model_path, "*.safetensors")))
    phase, shown, load_start, last_print = "starting", None, None, start

    def relay(now):
        """Prints the log's new loading progress and milestones; whether it printed any."""
        nonlocal phase, shown, load_start
        printed = False
        for line in log.new_lines():
            progress = load_progress(line)
            if progress and progress != shown:
                shown = progress
                load_start = load_start or now
                phase, rate = progress_text(progress, weights, now - load_start)
                print(f"{phase} ({fmt(now - start)} elapsed{rate})", flush=True)
                printed = True
            elif not progress and any(m in line for m in MILESTONES):
                print(f"vllm: {line.strip()}", flush=True)
                printed = True
        return printed

    print(f"waiting up to {fmt(a.timeout)} for vllm serve ({what}) on {a.node}; log {log_name}", flush=True)
    while True:
        now = time.monotonic()
        if relay(now):
            last_print = now
        if not is_alive():
            print(f"vllm serve on {a.node} exited while {phase}. Last lines of {log_name}:\n{log_tail()}",
                  file=sys.stderr, flush=True)
            return 1
        health, _ = get(a.url + "/health", None)
        if health == 200:
            status, body = get(a.url + "/v1/models", key)
            models = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
            phase = f"/health is up; /v1/models answered {status} with {models}"
            if a.model in models:
                # /health and /v1/models stay up while the engine is wedged: one real completion says it serves.
                status, _ = get(a.url + "/v1/chat/completions", key, {
                    "model": a.model, "max_tokens": 1, "messages": [{"role": "user", "content": "ready?"}]})
                if status == 200:
                    # vLLM listens before it loads, so /health can answer while this round's log read missed the
                    # last lines ("Loading weights took", which the stack's `load` output is read from).
                    relay(time.monotonic())
                    print(f"ready: {a.model} served at {a.url} after {fmt(now - start)}", flush=True)
                    return 0
                phase = f"{a.model} is listed, but one completion answered {status}"
        if now >= deadline:
            print(f"vllm serve on {a.node} is still running ({what}) but not ready after {fmt(a.timeout)} "
                  f"({phase}). Last lines of {log_name}:\n{log_tail()}", file=sys.stderr, flush=True)
            return 1
        if now - last_print >= a.heartbeat:
            print(f"still waiting: {phase}, {fmt(now - start)} elapsed, {fmt(deadline - now)} left", flush=True)
            last_print = now
        time.sleep(0.25)  # each round is a pid check, a log read and a local HTTP call: cheap


if __name__ == "__main__":
    sys.exit(main())
