"""The load turn (components/remote/load_turn.py) against a stand-in `docker` that keeps its containers in a file:
one stack loads on a node at a time, and a turn whose holder has loaded, left or timed out is taken over.
The lab runs the script for real (tests/e2e/test_placement.py)."""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.resources.load_turn import give_back

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "remote" / "load_turn.py"
TURN = "spark-vllm-load-turn"

# Enough of Docker's CLI for the script: create (names unique), inspect of the labels, rm -f, ps by stack label.
FAKE_DOCKER = r'''#!/usr/bin/env python3
import json, sys
state_file = sys.argv[0] + ".json"
state = json.load(open(state_file))
args = sys.argv[1:]
def save():
    json.dump(state, open(state_file, "w"))
if args[:2] == ["image", "inspect"]:
    sys.exit(0 if args[2] in state["images"] else f"Error: No such image: {args[2]}")
elif args[0] == "import":
    state["images"].append(args[2])
    state["imported"] = len(sys.stdin.buffer.read())
    save()
elif args[0] == "create":
    name = args[args.index("--name") + 1]
    if args[-2] not in state["images"]:
        sys.exit(f"Unable to find image '{args[-2]}' locally")
    if name in state["containers"]:
        sys.exit(f"Error response from daemon: Conflict. The container name \"/{name}\" is already in use")
    labels = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--label")
    state["containers"][name] = {"labels": labels, "image": args[-2]}
    save()
elif args[0] == "inspect":
    found = state["containers"].get(args[-1])
    if found is None:
        sys.exit(f"Error: No such object: {args[-1]}")
    label = args[2].split('"')[1] if "index .Config.Labels" in args[2] else None
    print(found["labels"].get(label, "") if label else json.dumps(found["labels"]))
elif args[0] == "rm":
    state["containers"].pop(args[-1], None)
    save()
elif args[0] == "ps":
    stack = args[args.index("--filter") + 1].split("=", 2)[2]
    print("\n".join(c for c in state["running"] if c == stack))
'''


@pytest.fixture
def node(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
    docker.chmod(0o755)

    class Node:
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

        def __init__(self):
            self.state = {"containers": {}, "running": [], "images": []}
            self.save()

        def save(self):
            Path(f"{docker}.json").write_text(json.dumps(self.state))

        def load(self):
            self.state = json.loads(Path(f"{docker}.json").read_text())
            return self.state

        def held_by(self, stack, since, until, health="", stack_label=False):
            turn = {"stack": stack, "since": int(since), "until": int(until), "health": health}
            labels = {"spark-vllm.load-turn": json.dumps(turn)}
            if stack_label:
                labels["spark-vllm.load-turn-stack"] = stack
            self.state["containers"][TURN] = {"labels": labels, "image": "x"}
            self.save()

        def run(self, *args, stack="mine", wait=30):
            argv = [sys.executable, str(SCRIPT), *args, f"--stack={stack}", "--node=spark1"]
            if args[0] == "take":
                argv += ["--health=http://127.0.0.1:1/health", "--hold=600", f"--wait={wait}"]
            return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=self.env)

        def holder(self):
            labels = self.load()["containers"].get(TURN, {}).get("labels", {})
            return json.loads(labels["spark-vllm.load-turn"])["stack"] if labels else None

    return Node()


def test_a_free_turn_is_taken_with_the_stack_and_its_bound_from_an_empty_image_made_on_the_node(node):
    done = node.run("take")
    assert done.returncode == 0 and done.stdout == "spark-vllm: spark1: took the load turn for stack mine\n"
    state = node.load()
    turn = state["containers"][TURN]
    held = json.loads(turn["labels"]["spark-vllm.load-turn"])
    assert held["stack"] == "mine" and held["until"] - held["since"] == 600
    assert held["health"] == "http://127.0.0.1:1/health"
    assert turn["labels"]["spark-vllm.load-turn-stack"] == "mine"
    # No model image pinned, nothing pulled: an empty tar (its two 512-byte end blocks, padded) imported once.
    assert turn["image"] == "spark-vllm/load-turn:empty" and state["images"] == ["spark-vllm/load-turn:empty"]
    assert state["imported"] == 10240
    node.state = state
    node.state["containers"] = {}
    node.save()
    assert node.run("take").returncode == 0 and node.load()["images"] == ["spark-vllm/load-turn:empty"]


def test_another_stacks_loading_turn_is_waited_for_and_named_at_the_bound(node):
    node.state["running"] = ["other"]
    node.held_by("other", time.time() - 5, time.time() + 600)
    started = time.monotonic()
    done = node.run("take", wait=3)
    assert done.returncode == 1 and 2.5 < time.monotonic() - started < 10
    assert re.fullmatch(r"spark-vllm: spark1: waiting for stack other to load first \([5-7] s since it started\)\n",
                        done.stdout), done.stdout  # once: progress every 15 s
    assert done.stderr.startswith("spark-vllm: spark1: stack other still holds the load turn after 3 s (taken ")
    assert done.stderr.rstrip().endswith("Fix: wait for it to load, or `pulumi destroy -s other`; `docker rm -f "
                                         "spark-vllm-load-turn` on spark1 ends a turn whose holder is gone")
    assert node.holder() == "other"


@pytest.fixture
def health():
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()


def test_a_turn_whose_holder_has_loaded_is_taken_over(node, health):
    node.state["running"] = ["other"]
    node.held_by("other", time.time() - 5, time.time() + 600, health)
    done = node.run("take")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "spark-vllm: spark1: stack other has loaded (its API answers): its load " \
                                          "turn is over"
    assert node.holder() == "mine"


def test_a_turn_whose_holder_is_gone_from_the_node_is_taken_over_after_the_grace(node):
    node.held_by("other", time.time() - 5, time.time() + 600)  # none of its containers runs, but it just took it
    assert node.run("take", wait=2).returncode == 1
    node.held_by("other", time.time() - 120, time.time() + 600)
    done = node.run("take")
    assert done.returncode == 0
    assert "no container of stack other runs here: its load turn is over" in done.stdout
    assert node.holder() == "mine"


def test_a_timed_out_turn_and_this_stacks_own_are_taken_over(node):
    node.state["running"] = ["other"]
    node.held_by("other", time.time() - 700, time.time() - 100)
    done = node.run("take")
    assert done.returncode == 0 and "stack other's turn timed out: its load turn is over" in done.stdout
    node.held_by("mine", time.time() - 5, time.time() + 600)
    done = node.run("take")
    assert done.returncode == 0 and "over" not in done.stdout  # its own earlier turn, taken again quietly


def test_destroy_gives_back_only_this_stacks_turn(node):
    def give():
        return subprocess.run(["sh", "-c", give_back("mine")], env=node.env, capture_output=True, text=True)

    assert give().returncode == 0  # no turn at all
    node.held_by("other", time.time(), time.time() + 600, stack_label=True)
    assert give().returncode == 0 and node.holder() == "other"
    node.held_by("mine", time.time(), time.time() + 600, stack_label=True)
    assert give().returncode == 0 and node.holder() is None
