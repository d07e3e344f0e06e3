"""The image's scripts on the nodes: the copy over the fabric (components/remote/image_copy.py) against a stand-in
docker and ssh, and the pull (image_pull.py) against a stand-in Docker Engine API on a unix socket."""

from __future__ import annotations

import base64
import json
import os
import socketserver
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from components.config import loader
from components.resources import image_transfer
from fixtures import KEY, stack_config, write_catalog
from harness import ROOT

SOURCE_ID, OTHER_ID = "sha256:" + "ab" * 32, "sha256:" + "cd" * 32

# docker as the source (FAKE_ROLE unset) or the target sees it: image ids in $FAKE_STATE/<role>.id.
FAKE_DOCKER = r"""#!/bin/sh
role=${FAKE_ROLE:-source}
state=$FAKE_STATE
case "$1 $2" in
  "image inspect")
    # As docker reads it: one format argument, then the image (a name, or the id of one it holds under any name).
    [ $# -eq 5 ] && [ "$4" = "{{.Id}} {{.Size}}" ] || { echo "Error: No such image: $5" >&2; exit 1; }
    if [ "$5" = vllm:a ]; then held="$state/$role.id"; else held="$state/$role.other"; fi
    [ -f "$held" ] && { [ "$5" = vllm:a ] || [ "$(cat "$held")" = "$5" ]; } ||
      { echo "Error: No such image: $5" >&2; exit 1; }
    echo "$(cat "$held") 2048" ;;
  "tag "*) cp "$state/$role.other" "$state/$role.id"; echo "$*" > "$state/tagged" ;;
  "save "*) head -c 3000000 /dev/zero ;;
  "load ")
    cat > "$state/loaded"
    cp "$state/loads-as" "$state/target.id"
    echo "Loaded image: vllm:a" ;;
esac
"""
# ssh to the target: the options and the destination dropped, the key file's mode kept, the command run as the target
# the way ssh runs it, its words joined by spaces and split again by the remote shell.
FAKE_SSH = r"""#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o) case "$2" in IdentityFile=*) key=${2#IdentityFile=}
          stat -c %a "$key" > "$FAKE_STATE/key.mode"; cp "$key" "$FAKE_STATE/key"; echo "$key" > "$FAKE_STATE/key.path"
        esac
        shift 2 ;;
    -p|-i) shift 2 ;;
    *) shift; break ;;  # the destination; the rest is the command
  esac
done
FAKE_ROLE=target exec sh -c "$*"
"""


@pytest.fixture
def fakes(tmp_path):
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("ssh", FAKE_SSH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (state / "source.id").write_text(SOURCE_ID)
    (state / "loads-as").write_text(SOURCE_ID)
    return bin_dir, state


def copy(tmp_path, bin_dir, state, wanted=SOURCE_ID, stall="30"):
    d = loader.load("t", stack_config(write_catalog(tmp_path / "catalog")), set(), ROOT)
    argv = image_transfer.copy_argv(d, "spark2", wanted, with_key=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_STATE": str(state), "TMPDIR": str(tmp_path)}
    argv = [*argv[:7], stall, *argv[8:]] if stall != "30" else argv
    return subprocess.run([sys.executable, *argv[1:]], input=image_transfer.with_secret("image_copy.py", "@KEY@", KEY),
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_copy_streams_the_image_and_checks_its_id_there(tmp_path, fakes):
    bin_dir, state = fakes
    done = copy(tmp_path, bin_dir, state)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (state / "loaded").stat().st_size == 3000000 and (state / "target.id").read_text() == SOURCE_ID
    lines = done.stdout.splitlines()
    assert lines[0] == (f"spark-vllm: copying vllm:a ({SOURCE_ID[:19]}, 2.0 KiB) to spark2 (192.168.200.2) over the "
                        "fabric")
    assert lines[-1].startswith("spark-vllm: copied vllm:a to spark2: 2.9 MiB in ")
    assert (state / "key").read_text() == KEY and (state / "key.mode").read_text().strip() == "600"
    assert not Path((state / "key.path").read_text().strip()).exists()  # its private folder is gone
    assert "unit-test-key-material" not in done.stdout + done.stderr


def test_a_node_that_holds_the_same_id_gets_nothing(tmp_path, fakes):
    bin_dir, state = fakes
    (state / "target.id").write_text(SOURCE_ID)
    done = copy(tmp_path, bin_dir, state)
    assert done.returncode == 0 and not (state / "loaded").exists()
    assert done.stdout.strip() == f"spark-vllm: nothing to copy: spark2 already holds vllm:a as {SOURCE_ID[:19]}"


def test_a_node_that_holds_the_build_under_another_name_gets_a_tag(tmp_path, fakes):
    bin_dir, state = fakes
    (state / "target.other").write_text(SOURCE_ID)  # e.g. the same build pulled under another registry's name
    done = copy(tmp_path, bin_dir, state)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (state / "loaded").exists() and (state / "tagged").read_text().split() == ["tag", SOURCE_ID, "vllm:a"]
    assert done.stdout.strip() == (f"spark-vllm: spark2 held {SOURCE_ID[:19]} under another name: tagged it vllm:a, "
                                   "nothing copied")


def test_an_id_that_differs_after_the_copy_fails(tmp_path, fakes):
    bin_dir, state = fakes
    (state / "loads-as").write_text(OTHER_ID)
    done = copy(tmp_path, bin_dir, state)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"spark-vllm: after the copy spark2 holds vllm:a as {OTHER_ID[:19]}, not "
                                   f"{SOURCE_ID[:19]}: the image ID differs after a copy; run pulumi up again")


def test_a_source_whose_build_changed_since_preflight_copies_nothing(tmp_path, fakes):
    bin_dir, state = fakes
    done = copy(tmp_path, bin_dir, state, wanted=OTHER_ID)
    assert done.returncode == 1 and not (state / "loaded").exists()
    assert done.stderr.strip() == (f"spark-vllm: this node's vllm:a is {SOURCE_ID[:19]} now, not {OTHER_ID[:19]} as "
                                   "preflight found it: run pulumi up again")


# ---- the pull, against a stand-in Docker Engine API ----

class Engine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def engine(socket_path: Path, events: list[dict], auth: list, held: dict):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def address_string(self):
            return "docker"

        def do_GET(self):
            if self.path.startswith("/images/") and held.get("id"):
                body = json.dumps({"Id": held["id"]}).encode()
                self.send_response(200)
            else:
                body = b'{"message": "No such image"}'
                self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            header = self.headers.get("X-Registry-Auth")
            auth.append(json.loads(base64.urlsafe_b64decode(header)) if header else None)
            auth.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for event in events:
                self.wfile.write(json.dumps(event).encode() + b"\r\n")
                if event.get("status") == "Status: Downloaded newer image for x":
                    held["id"] = SOURCE_ID

    server = Engine(str(socket_path), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


PULLED = [{"status": "Pulling from nvidia/vllm", "id": "26.10-py3"},
          {"status": "Downloading", "id": "l1", "progressDetail": {"current": 512, "total": 1024}},
          {"status": "Downloading", "id": "l2", "progressDetail": {"current": 100, "total": 2048}},
          {"status": "Download complete", "id": "l1"}, {"status": "Download complete", "id": "l2"},
          {"status": "Status: Downloaded newer image for x"}]


def pull(tmp_path, events, user="$oauthtoken", held=None, password="nvapi-secret"):
    socket_path, auth, held = tmp_path / "docker.sock", [], held if held is not None else {}
    server = engine(socket_path, events, auth, held)
    try:
        text = image_transfer.with_secret("image_pull.py", "@PASSWORD@", password)
        done = subprocess.run([sys.executable, "-", "nvcr.io/nvidia/vllm:26.10-py3", "nvcr.io", user, "", "30",
                               "spark1"], input=text, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "DOCKER_HOST": f"unix://{socket_path}"})
    finally:
        server.shutdown()
        server.server_close()
    return done, auth


def test_the_pull_logs_in_with_the_request_and_counts_bytes(tmp_path):
    done, auth = pull(tmp_path, PULLED)
    assert done.returncode == 0, done.stdout + done.stderr
    assert auth == [{"username": "$oauthtoken", "password": "nvapi-secret", "serveraddress": "nvcr.io"},
                    "/images/create?fromImage=nvcr.io%2Fnvidia%2Fvllm&tag=26.10-py3"]
    assert done.stdout.splitlines()[0] == "spark-vllm: pulling nvcr.io/nvidia/vllm:26.10-py3 on spark1 from nvcr.io " \
                                          "as $oauthtoken"
    assert done.stdout.splitlines()[-1].startswith(f"spark-vllm: pulled nvcr.io/nvidia/vllm:26.10-py3 on spark1 as "
                                                   f"{SOURCE_ID[:19]}: 3.0 KiB in ")
    assert "nvapi-secret" not in done.stdout + done.stderr


def test_a_refused_login_is_one_sentence(tmp_path):
    done, _ = pull(tmp_path, [{"errorDetail": {"message": "x"}, "error": "unauthorized: authentication required"}])
    assert done.returncode == 1
    assert done.stderr.strip() == ("spark-vllm: the registry nvcr.io refused user $oauthtoken for "
                                   "nvcr.io/nvidia/vllm:26.10-py3 (unauthorized: authentication required)")


def test_without_a_user_no_login_is_sent(tmp_path):
    done, auth = pull(tmp_path, PULLED, user="", password="")
    assert done.returncode == 0 and auth[0] is None


def test_a_node_that_holds_it_pulls_nothing(tmp_path):
    done, auth = pull(tmp_path, PULLED, held={"id": SOURCE_ID})
    assert done.returncode == 0 and auth == []
    assert done.stdout.strip() == (f"spark-vllm: nothing to pull: spark1 already holds nvcr.io/nvidia/vllm:26.10-py3 "
                                   f"as {SOURCE_ID[:19]}")
