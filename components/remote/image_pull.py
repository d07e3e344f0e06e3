# mypy: disable-error-code="name-defined"
# (say, human and SHOW_EVERY_S come first when it is sent: components/remote/progress.py)
"""Pulls the model's image from its registry on this node, through the Docker Engine API, with progress in bytes
(components/resources/image_transfer.py). The credentials go to the daemon in the request's X-Registry-Auth header:
no `docker login`, nothing stored on the node. A pull that moves no byte for `stall_s` is cut (the daemon stops a
pull whose client went away), and what it finished stays for the next one.

Runs on the node as `python3 - ARGS` with this text on stdin; the registry password arrives base64-encoded in this
text (a secret), never on a command line. Arguments: image registry user wanted_id stall_s node
"""

import base64
import http.client
import json
import os
import socket
import sys
import threading
import time
from urllib.parse import quote, urlencode

PASSWORD = base64.b64decode("@PASSWORD@").decode()


class Engine(http.client.HTTPConnection):
    """The node's Docker daemon on its unix socket (DOCKER_HOST when it names one)."""

    def __init__(self, timeout):
        super().__init__("docker", timeout=timeout)
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        self.path = host[len("unix://"):] if host.startswith("unix://") else "/var/run/docker.sock"

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def split(image):
    """(repository, tag or digest) as the API's fromImage and tag take them."""
    if "@" in image:
        repo, _, digest = image.partition("@")
        return repo, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    return (image[:colon], image[colon + 1:]) if colon > slash else (image, "latest")


def image_id(image):
    engine = Engine(60)
    engine.request("GET", f"/images/{quote(image, safe='')}/json")
    answer = engine.getresponse()
    body = answer.read()
    return json.loads(body)["Id"] if answer.status == 200 else None


def sentence(message, image, registry, user):
    text = message.lower()
    if "unauthorized" in text or "authentication required" in text or "denied" in text:
        who = f"user {user}" if user else "no login (spark-vllm:images.registryUser is not set)"
        return f"the registry {registry} refused {who} for {image} ({message})"
    if "not found" in text or "manifest unknown" in text:
        return f"the registry {registry} has no {image} ({message})"
    return f"pulling {image} from {registry} failed: {message}"


def main():
    image, registry, user, wanted, stall, node = sys.argv[1:7]
    stall_s = int(stall)
    held = image_id(image)
    if held is not None and (not wanted or held == wanted):
        say(f"nothing to pull: {node} already holds {image} as {held[:19]}")
        return
    repo, tag = split(image)
    headers = {}
    if user:
        auth = {"username": user, "password": PASSWORD, "serveraddress": registry}
        headers["X-Registry-Auth"] = base64.urlsafe_b64encode(json.dumps(auth).encode()).decode()
    say(f"pulling {image} on {node} from {registry}" + (f" as {user}" if user else ""))
    engine = Engine(stall_s)
    layers: dict[str, tuple[int, int]] = {}  # layer id -> (bytes got, its size)
    state, start = {"done": False}, time.monotonic()

    def watch():
        shown = start
        while not state["done"]:
            time.sleep(1)
            now = time.monotonic()
            got = sum(c for c, _ in layers.values())
            if now - shown >= SHOW_EVERY_S:
                shown = now
                total = sum(t for _, t in layers.values())
                say(f"{human(got)} of {human(total)} pulled on {node} at {got / 1e9 / (now - start):.2f} GB/s "
                    f"({len(layers)} layers)")

    threading.Thread(target=watch, daemon=True).start()
    try:
        engine.request("POST", f"/images/create?{urlencode({'fromImage': repo, 'tag': tag})}", headers=headers)
        answer = engine.getresponse()
        if answer.status != 200:
            message = json.loads(answer.read() or b"{}").get("message", f"HTTP {answer.status}")
            raise SystemExit("spark-vllm: " + sentence(message, image, registry, user))
        for line in answer:  # one JSON object a line; the socket's timeout is the stall bound
            event = json.loads(line)
            if "error" in event:
                raise SystemExit("spark-vllm: " + sentence(event["error"], image, registry, user))
            detail = event.get("progressDetail") or {}
            if event.get("status") == "Downloading" and detail.get("total"):
                layers[event["id"]] = (detail.get("current", 0), detail["total"])
            elif event.get("status") in ("Download complete", "Already exists") and event.get("id") in layers:
                layers[event["id"]] = (layers[event["id"]][1], layers[event["id"]][1])
    except socket.timeout:
        raise SystemExit(f"spark-vllm: the pull of {image} on {node} stalled: nothing moved for {stall_s} s "
                         "(spark-vllm:images.stallSeconds); run pulumi up again, the layers it finished stay") from None
    except OSError as e:
        raise SystemExit(f"spark-vllm: Docker on {node} did not take the pull: {e}") from None
    finally:
        state["done"] = True
    got = image_id(image)
    if got is None:
        raise SystemExit(f"spark-vllm: the pull of {image} on {node} ended, but the image is not there")
    if wanted and got != wanted:
        raise SystemExit(f"spark-vllm: {node} pulled {image} as {got[:19]}, but the other nodes run {wanted[:19]}: "
                         "the registry's tag moved since; pull it on every node, or name the image by its digest")
    seconds = max(time.monotonic() - start, 1e-3)
    moved = sum(c for c, _ in layers.values())
    say(f"pulled {image} on {node} as {got[:19]}: {human(moved)} in {seconds:.1f} s, "
        f"{moved / 1e9 / seconds:.2f} GB/s")


main()
