"""Takes this node's load turn for a stack: one stack's vLLM loads on a node at a time.

vLLM's start-up profiles free memory, and asserts when another process frees memory meanwhile; on a GB10 every
vLLM on the node shares the one memory. So a stack about to start vLLM takes the node's turn first, and waits
while another stack holds it (docs/placement.md).

The turn is a container that is created and never started, `spark-vllm-load-turn`: Docker's container names are
unique on a node, so creating it is atomic whoever races for it. It is made from an empty image imported on the
node (`spark-vllm/load-turn:empty`), so that it pins no model image and needs no registry. Its labels name the
holder's stack, when it took the turn, until when at most, and the holder's /health URL. A held turn is over, and
taken over, when:
  * the holder's API answers /health: vLLM serves HTTP only once its engine has loaded;
  * or no container of the holder's stack runs on this node, a minute after it took the turn (a destroyed or
    failed stack; the minute covers the holder's own containers starting);
  * or its time is up (the holder's serveReadySeconds: an `up` killed while it held the turn);
  * or the holder is this stack (a new load of it).

Runs on the node (`python3 - take ARGS`, this file on stdin), as the SSH user, who runs Docker. Exit 0 with the
turn taken; exit 1 with the holder named when the wait's bound passes. A stack's `destroy` gives its turn back
(components/resources/load_turn.py).
"""

import argparse
import io
import json
import subprocess
import sys
import tarfile
import time
import urllib.request

NAME = "spark-vllm-load-turn"
IMAGE = "spark-vllm/load-turn:empty"
LABEL = "spark-vllm.load-turn"
GRACE_S = 60
PROGRESS_S = 15


def docker(*argv, timeout=30):
    done = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout.strip(), done.stderr.strip()


def holder():
    """The turn's holder from its labels, or None when no stack holds it."""
    code, out, _ = docker("inspect", "-f", "{{json .Config.Labels}}", NAME)
    if code != 0:
        return None
    labels = json.loads(out) or {}
    held = json.loads(labels.get(LABEL, "{}"))
    return held if held.get("stack") else {"stack": "?", "since": 0, "until": 0, "health": ""}


def answers(url):
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def runs_here(stack):
    code, out, _ = docker("ps", "-q", "--filter", f"label=spark-vllm.stack={stack}")
    return code != 0 or bool(out)  # Docker not answering: assume it runs, and wait


def over(held, stack, now):
    """Why the held turn is over, or None while it is not."""
    if held["stack"] == stack:
        return "this stack's own earlier turn"
    if now > held["until"]:
        return f"stack {held['stack']}'s turn timed out"
    if held["health"] and answers(held["health"]):
        return f"stack {held['stack']} has loaded (its API answers)"
    if now - held["since"] > GRACE_S and not runs_here(held["stack"]):
        return f"no container of stack {held['stack']} runs here"
    return None


def empty_image():
    """The turn's image: imported from an empty tar where it is missing (a second import only tags it again)."""
    if docker("image", "inspect", IMAGE)[0] == 0:
        return None
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    done = subprocess.run(["docker", "import", "-", IMAGE], input=empty.getvalue(), capture_output=True, timeout=60)
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()


def take(args):
    failed = empty_image()
    if failed:
        print(f"spark-vllm: {args.node}: could not import the load turn's empty image: {failed}", file=sys.stderr)
        return 1
    start = time.time()
    deadline = start + args.wait
    shown = 0.0
    while True:
        now = time.time()
        turn = {"stack": args.stack, "since": int(now), "until": int(now) + args.hold, "health": args.health}
        code, _, err = docker("create", "--name", NAME, "--label", f"{LABEL}={json.dumps(turn)}",
                              "--label", f"{LABEL}-stack={args.stack}", IMAGE, "true")
        if code == 0:
            print(f"spark-vllm: {args.node}: took the load turn for stack {args.stack}"
                  + (f" after {now - start:.0f} s" if now - start >= 1 else ""))
            return 0
        held = holder()
        if held is None:
            if "Conflict" not in err:  # not a race lost to another stack: Docker itself failed
                print(f"spark-vllm: {args.node}: could not take the load turn: {err.splitlines()[-1:]}",
                      file=sys.stderr)
                return 1
            continue
        why = over(held, args.stack, now)
        if why:
            docker("rm", "-f", NAME)
            if held["stack"] != args.stack:
                print(f"spark-vllm: {args.node}: {why}: its load turn is over")
            continue
        if now >= deadline:
            print(f"spark-vllm: {args.node}: stack {held['stack']} still holds the load turn after {args.wait} s "
                  f"(taken {now - held['since']:.0f} s ago, until {held['until'] - now:.0f} s from now). Fix: wait "
                  f"for it to load, or `pulumi destroy -s {held['stack']}`; `docker rm -f {NAME}` on "
                  f"{args.node} ends a turn whose holder is gone", file=sys.stderr)
            return 1
        if now - shown >= PROGRESS_S:
            print(f"spark-vllm: {args.node}: waiting for stack {held['stack']} to load first "
                  f"({now - held['since']:.0f} s since it started)", flush=True)
            shown = now
        time.sleep(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=("take",))
    parser.add_argument("--stack", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--health", default="")
    parser.add_argument("--hold", type=int, default=0, help="seconds the turn is held at most")
    parser.add_argument("--wait", type=int, default=0, help="seconds to wait for another stack's turn")
    args = parser.parse_args()
    sys.exit(take(args))


if __name__ == "__main__":
    main()
