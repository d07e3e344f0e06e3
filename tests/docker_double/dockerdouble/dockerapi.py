"""Docker Engine HTTP API over the same transport pulumi-docker uses.

For `ssh://user@host:port` hosts pulumi-docker (via the docker CLI connection helper) runs the local `ssh`
binary with the provider's sshOpts and `docker system dial-stdio` on the node, then speaks HTTP over that
process's stdio. This module does the same with a socketpair; `unix://` hosts connect to the socket directly.
"""

import http.client
import json
import logging
import socket
import subprocess
import threading
import time
import urllib.parse

log = logging.getLogger("docker-double")

# Highest API version whose request shapes this double was written against (Docker 20.10 serves 1.41).
MAX_API_VERSION = (1, 41)
SOCKET_TIMEOUT_S = 120


class DockerError(Exception):
    """The daemon answered with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ConnectError(Exception):
    """The node's Docker daemon could not be reached."""


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


class _Connection:
    """One HTTP connection, with the ssh process carrying it (if any) and that process's stderr."""

    def __init__(self, sock: socket.socket, proc: subprocess.Popen | None):
        sock.settimeout(SOCKET_TIMEOUT_S)
        self.http = http.client.HTTPConnection("docker")
        self.http.sock = sock
        self.proc = proc
        self.stderr = bytearray()
        if proc is not None:
            threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self) -> None:
        for chunk in iter(lambda: self.proc.stderr.read1(4096), b""):
            self.stderr += chunk
            del self.stderr[:-8192]

    def failure_detail(self) -> str:
        if self.proc is None:
            return ""
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        time.sleep(0.1)  # let the drain thread take the last stderr bytes
        said = self.stderr.decode(errors="replace").strip() or "(nothing on stderr)"
        return f"; ssh exit status {rc}; ssh stderr: {said}"

    def close(self) -> None:
        self.http.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class DockerHost:
    """A Docker daemon reached like pulumi-docker reaches it; `host` is the provider's `host` input."""

    def __init__(self, host: str, ssh_opts: list[str]):
        self.host = host
        self.ssh_opts = list(ssh_opts)
        url = urllib.parse.urlsplit(host)
        if url.scheme not in ("ssh", "unix"):
            raise ValueError(f"host {host!r}: the docker test double supports only ssh:// and unix:// hosts")
        self.url = url
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._api: str | None = None

    def ssh_argv(self) -> list[str]:
        url = self.url
        argv = ["ssh", *self.ssh_opts]
        # The docker CLI connection helper adds these two unless the user's flags already set them.
        if "ConnectTimeout" not in "".join(self.ssh_opts):
            argv += ["-o", "ConnectTimeout=30"]
        if "-T" not in self.ssh_opts:
            argv.append("-T")
        if url.username:
            argv += ["-l", url.username]
        if url.port:
            argv += ["-p", str(url.port)]
        argv += ["--", url.hostname, "docker"]
        if url.path not in ("", "/"):
            argv += ["--host", "unix://" + url.path]
        return argv + ["system", "dial-stdio"]

    def _open(self) -> _Connection:
        if self.url.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.url.path)
            except OSError as err:
                sock.close()
                raise ConnectError(f"cannot reach the Docker daemon of {self.host}: {err}") from err
            return _Connection(sock, None)
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(self.ssh_argv(), stdin=theirs, stdout=theirs, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as err:
            ours.close()
            raise ConnectError(f"cannot run ssh for {self.host}: {err}") from err
        finally:
            theirs.close()
        return _Connection(ours, proc)

    def _checkout(self) -> tuple[_Connection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._open(), False

    def _raw(self, method: str, path: str, body: bytes | None, headers: dict) -> tuple[int, bytes]:
        for attempt in (1, 2):
            conn, reused = self._checkout()
            try:
                conn.http.request(method, path, body=body, headers=headers)
                resp = conn.http.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                if reused and attempt == 1:
                    continue  # an idle connection went stale; retry once on a fresh one
                raise ConnectError(f"cannot reach the Docker daemon of {self.host} "
                                   f"({' '.join(self.ssh_argv()) if conn.proc else self.url.path}): "
                                   f"{err!r}{conn.failure_detail()}") from err
            if resp.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.append(conn)
            return resp.status, payload
        raise AssertionError("unreachable")

    def api_version(self) -> str:
        if self._api is None:
            status, payload = self._raw("GET", "/version", None, {})
            if status != 200:
                raise DockerError(status, f"{self.host}: GET /version answered {status}: {payload[:200]!r}")
            info = json.loads(payload)
            chosen = min(_version_tuple(info["ApiVersion"]), MAX_API_VERSION)
            chosen = max(chosen, _version_tuple(info.get("MinAPIVersion", "1.12")))
            self._api = ".".join(map(str, chosen))
            log.debug("%s: server API %s, using %s", self.host, info["ApiVersion"], self._api)
        return self._api

    def call(self, method: str, path: str, body=None, query: dict | None = None, ok=(200, 201, 204, 304)):
        """One API call; returns decoded JSON when the answer is JSON, else bytes. Errors raise DockerError."""
        url = f"/v{self.api_version()}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        status, payload = self._raw(method, url, data, headers)
        if status not in ok:
            try:
                message = json.loads(payload).get("message", "")
            except ValueError:
                message = payload.decode(errors="replace")
            raise DockerError(status, f"Error response from daemon at {self.host}: {message.strip()}")
        if payload[:1] in (b"{", b"["):
            return json.loads(payload)
        return payload

    def ping(self) -> None:
        status, payload = self._raw("GET", "/_ping", None, {})
        if status != 200:
            raise DockerError(status, f"Error pinging Docker server at {self.host}: {payload[:200]!r}")

    def inspect(self, kind: str, name: str) -> dict | None:
        """`kind` is "containers" or "images"; None when the daemon has no such object."""
        try:
            return self.call("GET", f"/{kind}/{urllib.parse.quote(name, safe='/:@')}/json")
        except DockerError as err:
            if err.status == 404:
                return None
            raise

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

