# mypy: disable-error-code="name-defined"
# (say, human and SHOW_EVERY_S come first when it is sent: components/remote/progress.py)
"""Downloads a model's files from the Hugging Face Hub into its weights folder, with the real huggingface_hub client.

Runs inside the model's image (which carries the client), as `python3 -` with this text on stdin, sent by
components/remote/hub_download.sh; the spec and the token arrive base64-encoded in this text, never on a command
line. It fetches the listed files of one commit, 8 at a time, with `hf_hub_download(local_dir=...)`: a file the
folder already holds with the same ETag is not fetched again (huggingface_hub's own metadata under .cache/), so a new
revision fetches only what changed and a failed run's finished files stay. It prints progress (bytes of the total,
GB/s, the time left), fails naming the files when no byte arrives for `stallSeconds`, and records what it did in
`.cache/spark-vllm/hub.json`, which preflight reads (components/nodes/hub_plan.py).
"""

import base64
import errno
import json
import os
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

SPEC = json.loads(base64.b64decode("@SPEC@"))
TOKEN = base64.b64decode("@TOKEN@").decode() or None
RECORD = ".cache/spark-vllm/hub.json"
INCOMPLETE_DIR = ".cache/huggingface/download"  # where huggingface_hub writes a file in flight (local_dir mode)
WORKERS = 8


def left(seconds):
    if seconds >= 3600:
        return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
    return f"{seconds // 60:.0f} min {seconds % 60:.0f} s" if seconds >= 60 else f"{seconds:.0f} s"


def fail(text, code=1):
    say(text)
    sys.stdout.flush()
    os._exit(code)  # the other downloads' threads end with the process; what they finished stays


def write_record(path, complete):
    record = {key: SPEC[key] for key in ("repo", "revision", "commit", "files", "fetch")}
    record["complete"] = complete
    target = os.path.join(path, RECORD)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(target + ".tmp", target)


def read_record(path):
    try:
        with open(os.path.join(path, RECORD)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


class Progress:
    """Bytes on disk of the files to fetch: finished ones, and huggingface_hub's files in flight."""

    def __init__(self, path, sizes, present):
        self.path, self.sizes = path, sizes
        self.finished, self.running = set(present), set()
        self.lock = threading.Lock()
        self.start = time.monotonic()
        self.before = self.on_disk()  # what was already here, fetched or not: not this run's transfer

    def on_disk(self):
        with self.lock:
            done = sum(self.sizes[name] for name in self.finished)
        folder = os.path.join(self.path, INCOMPLETE_DIR)
        try:
            flight = sum(e.stat().st_size for e in os.scandir(folder) if e.name.endswith(".incomplete"))
        except OSError:
            flight = 0
        return done + flight


def download(name, progress):
    from huggingface_hub import hf_hub_download

    with progress.lock:
        progress.running.add(name)
    hf_hub_download(SPEC["repo"], name, revision=SPEC["commit"], local_dir=progress.path,
                    endpoint=SPEC["endpoint"], token=TOKEN or False)
    with progress.lock:
        progress.running.discard(name)
        progress.finished.add(name)


def sentence(name, error):
    """What went wrong with one file, in one sentence."""
    kind = type(error).__name__
    where = f"{SPEC['repo']} on {SPEC['endpoint']}"
    if kind == "GatedRepoError":
        return f"{where} is gated, and the stack's hfToken has no access to it"
    if kind in ("RepositoryNotFoundError",):
        return f"{where} does not exist, or is private and the stack's hfToken cannot read it"
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return f"{where} has no {name} at {SPEC['commit']}"
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return f"the disk of {SPEC['path']} on {SPEC['node']} is full"
    text = (str(error).strip().splitlines() or [""])[0]
    return f"the Hub at {SPEC['endpoint']} failed while sending {name}: {kind}: {text}"


def main():
    path, stall_s = SPEC["path"], SPEC["stallSeconds"]
    try:
        import huggingface_hub
    except ImportError:
        fail("the image has no huggingface_hub, which the download runs with: use a vLLM image (it carries it)")
    sizes = {p: size for p, size, _ in SPEC["files"] if p in set(SPEC["fetch"])}
    total = sum(sizes.values())
    present = {p for p, size in sizes.items() if os.path.isfile(os.path.join(path, p))
               and os.path.getsize(os.path.join(path, p)) == size}
    st = os.statvfs(path)
    free, need = st.f_bavail * st.f_frsize, sum(size for p, size in sizes.items() if p not in present)
    if need > free:
        fail(f"{SPEC['node']} has {human(free)} free at {path}, and the download needs {human(need)} more; free "
             "some space (or move the weights' path), then run pulumi up again", 2)
    previous = read_record(path)
    write_record(path, complete=False)
    say(f"downloading {SPEC['repo']}@{SPEC['commit'][:12]} ({SPEC['revision']}) on {SPEC['node']} into {path} "
        f"with huggingface_hub {huggingface_hub.__version__}: {len(sizes)} files, {human(total)}; "
        f"{len(present)} already here")
    progress = Progress(path, sizes, present)
    watch = threading.Thread(target=watchdog, args=(progress, total, stall_s), daemon=True)
    watch.start()
    todo = sorted(sizes, key=lambda p: -sizes[p])
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {pool.submit(download, name, progress): name for name in todo}
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for future in done:
            if future.exception() is not None:
                name = futures[future]
                fail(f"the download of {name} failed: {sentence(name, future.exception())}; the files it "
                     "finished stay, and the next pulumi up fetches the rest")
    stale = sorted(set(previous.get("fetch", [])) - set(SPEC["fetch"]))
    for name in stale:  # what the previous revision had and this one has not; never a file it did not fetch
        try:
            os.remove(os.path.join(path, name))
        except FileNotFoundError:
            pass
    write_record(path, complete=True)
    seconds = max(time.monotonic() - progress.start, 1e-3)
    moved = max(progress.on_disk() - progress.before, 0)
    say(f"downloaded {SPEC['repo']}@{SPEC['commit'][:12]}: {len(sizes)} files, {human(total)}, in {seconds:.1f} s; "
        f"{human(moved)} fetched at {moved / 1e9 / seconds:.2f} GB/s" +
        (f"; removed {len(stale)} files of the previous revision" if stale else ""))


def watchdog(progress, total, stall_s):
    """Shows progress, and ends the download when no byte arrives for stall_s while files are in flight."""
    last, last_change, shown = progress.on_disk(), time.monotonic(), time.monotonic()
    while True:
        time.sleep(1)
        now, done = time.monotonic(), progress.on_disk()
        if done != last:
            last, last_change = done, now
        with progress.lock:
            running, finished = sorted(progress.running), len(progress.finished)
        if running and now - last_change >= stall_s:
            fail(f"the download stalled: no byte of {', '.join(running)} arrived for {stall_s} s "
                 "(spark-vllm:serve.hub.stallSeconds); the files it finished stay, and the next pulumi up fetches "
                 "the rest", 3)
        if now - shown >= SHOW_EVERY_S:
            shown = now
            rate = max(done - progress.before, 0) / (now - progress.start)
            eta = f", about {left((total - done) / rate)} left" if rate > 0 else ""
            say(f"{human(done)} of {human(total)} ({100 * done / max(total, 1):.0f} %) at {rate / 1e9:.2f} GB/s, "
                f"{finished} of {len(progress.sizes)} files done{eta}")


main()
