"""A test double of the Hugging Face Hub's HTTP API: the part the real huggingface_hub client uses to read a model
repo (lab/hub_double/README.md). It is not the Hub.

    python3 lab/hub_double/server.py --bind 172.29.87.1 --port 18180 --data DIR [--tokens JSON] [--rate-mib N]

Serves the repos of repos.py. Besides the Hub's own routes it answers `GET /_double/stats` (the bytes it served per
file, and every request), `POST /_double/reset`, `POST /_double/stall?after=N[&file=NAME]` (each file, or
the one named, sent from then on stops after N bytes and hangs until `POST /_double/release`, or ends at the next
reset), for the tests to measure and to break it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repos import Repo, build  # noqa: E402

REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
API_INFO = re.compile(rf"/api/models/{REPO}(?:/revision/(?P<rev>[^/]+))?$")
API_TREE = re.compile(rf"/api/models/{REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
RESOLVE = re.compile(rf"/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
CHUNK = 64 << 10


class Hub:
    """What the double serves and remembers."""

    def __init__(self, repos: dict[str, Repo], tokens: dict[str, list[str]], rate: float):
        self.repos, self.tokens, self.rate = repos, tokens, rate  # token -> the gated/private repos it may read
        self.lock = threading.Lock()
        self.served: dict[str, int] = {}  # "repo/path" -> bytes sent
        self.requests: list[list] = []  # [method, path, status]
        self.stall_after: int | None = None
        self.stall_file: str | None = None  # only the file whose path ends so stalls; None: every file
        self.release = threading.Event()
        self.generation = 0  # a reset cuts every stalled response of the generation before it

    def reset(self) -> None:
        with self.lock:
            self.served.clear()
            self.requests.clear()
            self.stall_after = self.stall_file = None
            self.generation += 1
            self.release.set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hub-double/1"
    hub: Hub

    def log_message(self, fmt, *args):  # the stats hold every request; stderr stays quiet
        pass

    def do_HEAD(self):
        self._route(body=False)

    def do_GET(self):
        self._route(body=True)

    def do_POST(self):
        url = urlsplit(self.path)
        if url.path == "/_double/reset":
            self.hub.reset()
            return self._json(200, {})
        if url.path == "/_double/stall":
            query = parse_qs(url.query)
            with self.hub.lock:
                self.hub.stall_after = int(query.get("after", ["0"])[0])
                self.hub.stall_file = query.get("file", [None])[0]
                self.hub.release.clear()
            return self._json(200, {})
        if url.path == "/_double/release":
            with self.hub.lock:
                self.hub.stall_after = None
            self.hub.release.set()
            return self._json(200, {})
        self._error(404, "", "Not found")

    # -- routing

    def _route(self, body: bool):
        url = urlsplit(self.path)
        path = url.path
        if path == "/_double/stats":
            with self.hub.lock:
                stats = {"served": dict(self.hub.served), "requests": list(self.hub.requests)}
            return self._json(200, stats)
        for pattern, handler in ((API_INFO, self._info), (API_TREE, self._tree), (RESOLVE, self._resolve)):
            match = pattern.match(path)
            if match:
                repo = self._readable(match["repo"])
                if repo is not None:
                    handler(repo, match, parse_qs(url.query), body)
                return
        self._error(404, "", "Not found")

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _readable(self, name: str) -> Repo | None:
        """The repo, or None once the Hub's refusal is sent: an invalid token, a private or gated repo."""
        token = self._token()
        if token is not None and token not in self.hub.tokens:
            self._error(401, "", "Invalid credentials in Authorization header")
            return None
        repo = self.hub.repos.get(name)
        granted = token is not None and name in self.hub.tokens.get(token, [])
        if repo is None or (repo.private and not granted):
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and not granted:
            self._error(403, "GatedRepo", f"Access to model {name} is restricted and you are not in the authorized "
                                          f"list. Visit the model's page on the Hub to ask for access.")
            return None
        return repo

    def _commit(self, repo: Repo, revision: str) -> str | None:
        commit = repo.resolve(unquote(revision))
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {unquote(revision)}")
        return commit

    # -- the Hub's routes

    def _info(self, repo: Repo, match, query, body: bool):
        commit = self._commit(repo, match["rev"] or "main")
        if commit is None:
            return
        blobs = query.get("blobs", ["false"])[0] == "true"
        siblings = []
        for path, blob in sorted(repo.commits[commit].items()):
            sibling = {"rfilename": path}
            if blobs:
                sibling.update(size=blob.size, blobId=blob.blob_id)
                if blob.lfs:
                    sibling["lfs"] = {"size": blob.size, "sha256": blob.etag, "pointerSize": 134}
            siblings.append(sibling)
        # The Hub reads a model's config.json into its answer: the architectures and the model type.
        config_blob = repo.commits[commit].get("config.json")
        config = json.loads(config_blob.path.read_text()) if config_blob else {}
        self._json(200, {"_id": commit[:24], "id": repo.name, "modelId": repo.name, "private": repo.private,
                         "gated": "manual" if repo.gated else False, "sha": commit, "siblings": siblings,
                         "config": {k: config[k] for k in ("architectures", "model_type") if k in config},
                         "tags": [], "downloads": 0, "likes": 0}, body)

    def _tree(self, repo: Repo, match, query, body: bool):
        commit = self._commit(repo, match["rev"])
        if commit is None:
            return
        prefix = unquote(match["path"] or "").strip("/")
        entries, folders = [], set()
        for path, blob in sorted(repo.commits[commit].items()):
            if prefix and not path.startswith(prefix + "/"):
                continue
            parts = path.split("/")[:-1]
            folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
            entry = {"type": "file", "oid": blob.blob_id, "size": blob.size, "path": path}
            if blob.lfs:
                entry["lfs"] = {"oid": blob.etag, "size": blob.size, "pointerSize": 134}
            entries.append(entry)
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
        self._json(200, entries, body)

    def _resolve(self, repo: Repo, match, query, body: bool):
        commit = self._commit(repo, match["rev"])
        if commit is None:
            return
        path = unquote(match["path"])
        blob = repo.commits[commit].get(path)
        if blob is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on {commit}", {"X-Repo-Commit": commit})
        start, end = 0, blob.size - 1
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if ranged and body:
            start = int(ranged[1])
            end = min(int(ranged[2]), end) if ranged[2] else end
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                   "ETag": f'"{blob.etag}"', "Content-Length": str(end - start + 1)}
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.etag}"', "X-Linked-Size": str(blob.size)})
        status = 206 if ranged and body else 200
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{blob.size}"
        self._send(status, headers)
        if body:
            self._stream(f"{repo.name}/{path}", blob.path, start, end + 1)

    def _stream(self, key: str, file: Path, start: int, stop: int):
        with self.hub.lock:
            stall, generation = self.hub.stall_after, self.hub.generation
            if self.hub.stall_file is not None and not key.endswith(self.hub.stall_file):
                stall = None
        sent, began = 0, time.monotonic()
        with open(file, "rb") as f:
            f.seek(start)
            while start + sent < stop:
                if stall is not None and sent >= stall:
                    self.hub.release.wait()  # hangs, as a stalled CDN does, until released or reset
                    if self.hub.generation != generation:
                        break  # reset: the connection is cut, as a CDN that stalled would end it
                    stall = None
                data = f.read(min(CHUNK, stop - start - sent, (stall - sent) if stall is not None else CHUNK))
                try:
                    self.wfile.write(data)
                except OSError:
                    break  # the client went away
                sent += len(data)
                with self.hub.lock:
                    self.hub.served[key] = self.hub.served.get(key, 0) + len(data)
                if self.hub.rate:
                    ahead = sent / self.hub.rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)

    # -- answers

    def _send(self, status: int, headers: dict[str, str]):
        with self.hub.lock:
            self.hub.requests.append([self.command, self.path, status])
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _json(self, status: int, value, body: bool = True):
        data = json.dumps(value).encode()
        self._send(status, {"Content-Type": "application/json", "Content-Length": str(len(data))})
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None):
        data = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data)), "X-Error-Message": message,
                   **({"X-Error-Code": code} if code else {}), **(extra or {})}
        self._send(status, headers)
        if self.command != "HEAD":
            self.wfile.write(data)


def serve(bind: str, port: int, data: Path, tokens: dict[str, list[str]], rate_mib: float = 0.0,
          shard_mib: int = 4, shards: int = 4) -> ThreadingHTTPServer:
    """A started server (serve_forever in a daemon thread); its `hub` attribute is what it served."""
    hub = Hub(build(data, shard_mib=shard_mib, shards=shards), tokens, rate_mib * (1 << 20))
    handler = type("BoundHandler", (Handler,), {"hub": hub})
    server = ThreadingHTTPServer((bind, port), handler)
    server.daemon_threads = True
    server.hub = hub  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18180)
    parser.add_argument("--data", type=Path, required=True, help="where the repos' files are generated")
    parser.add_argument("--tokens", default="{}", help='JSON: token -> the gated or private repos it may read')
    parser.add_argument("--rate-mib", type=float, default=0.0, help="MiB/s a response is held to (0: no limit)")
    parser.add_argument("--shard-mib", type=int, default=4, help="each weight shard's size, a multiple of 4")
    parser.add_argument("--shards", type=int, default=4, help="how many weight shards (3 or more)")
    args = parser.parse_args()
    server = serve(args.bind, args.port, args.data, json.loads(args.tokens), args.rate_mib, args.shard_mib,
                   args.shards)
    print(f"hub double on http://{args.bind}:{server.server_address[1]}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
