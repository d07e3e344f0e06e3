# mypy: disable-error-code="name-defined"
# (say, human and SHOW_EVERY_S come first when it is sent: components/remote/progress.py)
"""Copies the model's image from this node to another over the fabric: `docker save` here, streamed through ssh into
`docker load` there, with progress in bytes (components/resources/image_transfer.py). Nothing is copied when the
other node already holds the same image id; after a copy its id must be this node's, or the copy fails.

Runs on the source node as `python3 - ARGS` with this text on stdin; the SSH key for the hop arrives base64-encoded
in this text (a secret whenever the key is), never on a command line, and lives in a 0600 file in a private temp
folder that is removed on exit. Arguments: image wanted_id target target_ip stall_s hop-ssh-argv...
(components/nodes/node_runner.py's hop_ssh, which reads the key and known_hosts from $SPARK_VLLM_SSH_DIR).
"""

import base64
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

KEY = base64.b64decode("@KEY@")
CHUNK = 4 << 20


def inspect(argv_prefix, image):
    """(id, size) of the image where argv_prefix runs docker, or (None, None) when it is not there. Through ssh the
    command is one string, which the other node's shell splits again: quoted."""
    argv = ["docker", "image", "inspect", "--format", "{{.Id}} {{.Size}}", image]
    done = subprocess.run([*argv_prefix, shlex.join(argv)] if argv_prefix else argv,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    if done.returncode != 0:
        if "no such image" in done.stderr.lower():
            return None, None
        raise SystemExit(f"spark-vllm: `docker image inspect` failed: {done.stderr.strip()}")
    image_id, _, size = done.stdout.strip().partition(" ")
    return image_id, int(size) if size.isdigit() else 0


def main():
    image, wanted, target, ip, stall = sys.argv[1:6]
    hop = sys.argv[6:]
    stall_s = int(stall)
    here, size = inspect([], image)
    if here is None:
        raise SystemExit(f"spark-vllm: {image} is not on this node any more, so it cannot be copied from here")
    if wanted and here != wanted:
        raise SystemExit(f"spark-vllm: this node's {image} is {here[:19]} now, not {wanted[:19]} as preflight found "
                         "it: run pulumi up again")
    folder = tempfile.mkdtemp()
    try:
        key = os.path.join(folder, "key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(KEY)
        os.environ["SPARK_VLLM_SSH_DIR"] = folder
        remote = [os.path.expandvars(word) for word in hop]
        theirs, _ = inspect(remote, image)
        if theirs == here:
            say(f"nothing to copy: {target} already holds {image} as {here[:19]}")
            return
        if inspect(remote, here)[0] == here:  # the same build under another name: a tag, not a copy
            subprocess.run([*remote, shlex.join(["docker", "tag", here, image])], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=120)
            say(f"{target} held {here[:19]} under another name: tagged it {image}, nothing copied")
        else:
            copy(image, here, size, target, ip, remote, stall_s)
        theirs, _ = inspect(remote, image)
        if theirs != here:
            raise SystemExit(f"spark-vllm: after the copy {target} holds {image} as {(theirs or 'nothing')[:19]}, "
                             f"not {here[:19]}: the image ID differs after a copy; run pulumi up again")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def copy(image, image_id, size, target, ip, remote, stall_s):
    say(f"copying {image} ({image_id[:19]}, {human(size)}) to {target} ({ip}) over the fabric")
    save = subprocess.Popen(["docker", "save", image], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    load = subprocess.Popen([*remote, "docker", "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert save.stdout is not None and load.stdin is not None and load.stdout is not None
    state = {"bytes": 0, "last": time.monotonic()}
    start = time.monotonic()

    def watch():
        shown = start
        while save.poll() is None:
            time.sleep(1)
            now = time.monotonic()
            if now - state["last"] >= stall_s:
                say(f"the copy to {target} stalled: no byte moved for {stall_s} s (spark-vllm:images.stallSeconds)")
                save.kill()
                load.kill()
                return
            if now - shown >= SHOW_EVERY_S:
                shown = now
                rate = state["bytes"] / (now - start)
                say(f"{human(state['bytes'])} of about {human(size)} copied to {target} at {rate / 1e9:.2f} GB/s")

    threading.Thread(target=watch, daemon=True).start()
    try:
        while True:
            data = save.stdout.read1(CHUNK)  # type: ignore[attr-defined]  # a BufferedReader: what has arrived
            if not data:
                break
            load.stdin.write(data)
            state["bytes"] += len(data)
            state["last"] = time.monotonic()
        load.stdin.close()
    except BrokenPipeError:
        pass
    out = load.stdout.read().decode(errors="replace")
    if save.wait() != 0 or load.wait() != 0:
        raise SystemExit(f"spark-vllm: the copy of {image} to {target} failed after {human(state['bytes'])} "
                         f"(docker save exit {save.returncode}, docker load on {target} exit {load.returncode}: "
                         f"{out.strip().splitlines()[-1] if out.strip() else 'no output'}); run pulumi up again")
    seconds = max(time.monotonic() - start, 1e-3)
    say(f"copied {image} to {target}: {human(state['bytes'])} in {seconds:.1f} s, "
        f"{state['bytes'] / 1e9 / seconds:.2f} GB/s")


main()
