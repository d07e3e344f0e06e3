"""One command on a remote host, run as pulumi-command's remote.Command runs it, with the local OpenSSH client.

pulumi-command (Go, x/crypto/ssh) dials, retrying failed dials up to dialErrorLimit, then runs the command in one
session: `session.Run(cmd)` hands the string to the remote user's login shell, stdin is fed from a string, and
stdout/stderr are captured and streamed. The double splits this over two ssh processes so that a failed dial is
never confused with the command's own exit status 255, and a retry never re-runs a command:

1. a control master (`ssh -M -N`) that only connects and authenticates, retried like pulumi-command's dial;
2. `ssh -S <control socket> -- host <cmd>`, the session, which needs no credentials.

Options mirror the Go client: no ssh config files (`-F /dev/null`), host keys ignored, public key auth only, with
the given key and the ssh agent (agentSocketPath, else $SSH_AUTH_SOCK), `ConnectTimeout` = perDialTimeout.
A proxy becomes a `ProxyCommand` ssh with the proxy's own key (`-J` would not carry these options to the hop).
Keys go to 0600 files in a 0700 directory, removed as soon as the master has authenticated: no secret is ever on
a command line or in an environment.
"""

import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from .connection import Endpoint

SSH = "ssh"
POLL_S = 0.02
DIAL_DELAY_S, DIAL_BACKOFF, DIAL_MAX_DELAY_S = 0.1, 1.5, 5.0  # pulumi's retry.Until defaults
READ_BYTES = 65536


class DialError(RuntimeError):
    """The host could not be reached or refused the credentials (after the allowed retries)."""


class Cancelled(RuntimeError):
    """The engine cancelled the operation (Cancel RPC or plugin shutdown)."""


@dataclass(frozen=True)
class Result:
    exit_status: int
    stdout: bytes
    stderr: bytes
    combined: bytes  # stdout and stderr in arrival order, as pulumi-command quotes them in its errors


class Processes:
    """Every ssh process the double runs, so that a shutdown can end them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self.cancelled = threading.Event()  # shutdown: running commands are ended
        self.closing = threading.Event()  # Cancel: no new connection, running commands go on

    def start(self, argv: list[str], **kwargs) -> subprocess.Popen:
        with self._lock:
            if self.cancelled.is_set():
                raise Cancelled("the operation was cancelled")
            proc = subprocess.Popen(argv, **kwargs)
            self._running.add(proc)
            return proc

    def finished(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._running.discard(proc)

    def close(self) -> None:
        """The engine's Cancel: upstream's running session ignores it (`session.Run` takes no context), so a
        running command finishes; only dialing stops."""
        self.closing.set()

    def cancel(self) -> None:
        with self._lock:
            self.closing.set()
            self.cancelled.set()
            for proc in self._running:
                proc.terminate()


def _escape_tokens(arg: str) -> str:
    return arg.replace("%", "%%")  # ssh expands %-tokens in ProxyCommand and ControlPath


def _common_options(endpoint: Endpoint, key_file: str | None) -> list[str]:
    agent = endpoint.agent_socket or os.environ.get("SSH_AUTH_SOCK") or "none"
    options = ["-F", "/dev/null",
               "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "-o", "PubkeyAuthentication=yes", "-o", "PasswordAuthentication=no",
               "-o", "KbdInteractiveAuthentication=no", "-o", "HostbasedAuthentication=no",
               "-o", "GSSAPIAuthentication=no",
               "-o", f"IdentityFile={key_file or 'none'}", "-o", f"IdentityAgent={agent}"]
    if endpoint.per_dial_timeout > 0:
        options += ["-o", f"ConnectTimeout={endpoint.per_dial_timeout}"]
    return options


def _proxy_command(proxy: Endpoint, key_file: str | None) -> str:
    hop = [_escape_tokens(a) for a in ["ssh", *_common_options(proxy, key_file), "-p", str(proxy.port),
                                       "-l", proxy.user]]
    return shlex.join(hop) + " -W %h:%p -- " + shlex.quote(_escape_tokens(proxy.host))


def master_argv(target: Endpoint, proxy: Endpoint | None, key_file: str | None, proxy_key_file: str | None,
                control: str) -> list[str]:
    argv = [SSH, *_common_options(target, key_file),
            "-o", "ControlMaster=yes", "-o", f"ControlPath={_escape_tokens(control)}", "-o", "ControlPersist=no",
            "-N", "-T", "-p", str(target.port), "-l", target.user]
    if proxy is not None:
        argv += ["-o", "ProxyCommand=" + _proxy_command(proxy, proxy_key_file)]
    return argv + ["--", target.host]


def session_argv(target: Endpoint, control: str, command: str) -> list[str]:
    # No credentials: if the master were gone, the fallback direct connection fails instead of running elsewhere.
    return [SSH, "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            "-o", "ControlMaster=no", "-o", f"ControlPath={_escape_tokens(control)}",
            "-o", "IdentityFile=none", "-o", "IdentityAgent=none", "-o", "PasswordAuthentication=no",
            "-o", "KbdInteractiveAuthentication=no",
            "-T", "-p", str(target.port), "-l", target.user, "--", target.host, command]


def _write_private(path: str, content: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(content if content.endswith("\n") else content + "\n")  # ssh rejects a key without it
    return path


def _validate_key(path: str, what: str) -> None:
    """Fail at once on a key ssh cannot use, as pulumi-command fails parsing it before dialing (no retries)."""
    out = subprocess.run(["ssh-keygen", "-y", "-P", "", "-f", path], capture_output=True, text=True)
    if out.returncode != 0:
        raise DialError(f"{what}: ssh cannot use the private key: {out.stderr.strip()}")


class _Workdir:
    """Private directory for key files and the control socket of one command run."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="cmd-double-")  # mode 0700
        self.keys: list[str] = []

    def key(self, name: str, content: str | None, what: str) -> str | None:
        if content is None:
            return None
        path = _write_private(os.path.join(self.path, name), content)
        self.keys.append(path)
        _validate_key(path, what)
        return path

    def drop_keys(self) -> None:
        for path in self.keys:
            if os.path.exists(path):
                os.remove(path)
        self.keys.clear()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _stop(procs: Processes, proc: subprocess.Popen) -> None:
    """Ends a master at once, as pulumi-command closes its connection's socket. A SIGTERM sometimes left the master
    running until a 5 s bound killed it (1 in 40 commands in the lab), which showed as 5 s steps in bench/run."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    procs.finished(proc)


def _master_ready(control: str, target: Endpoint) -> bool:
    if not os.path.exists(control):
        return False
    check = subprocess.run([SSH, "-F", "/dev/null", "-o", f"ControlPath={_escape_tokens(control)}", "-O", "check",
                            "-p", str(target.port), "-l", target.user, "--", target.host], capture_output=True)
    return check.returncode == 0


def _dial_once(procs: Processes, work: _Workdir, argv: list[str], control: str,
               target: Endpoint) -> tuple[subprocess.Popen | None, str]:
    err_path = os.path.join(work.path, "master.err")
    with open(err_path, "wb") as err:
        master = procs.start(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    while True:
        if procs.closing.is_set():
            _stop(procs, master)
            raise Cancelled("the operation was cancelled while connecting")
        if master.poll() is not None:
            procs.finished(master)
            with open(err_path, "rb") as f:
                message = f.read().decode(errors="replace").strip()
            return None, message or f"ssh exited with status {master.returncode} while connecting"
        if _master_ready(control, target):
            return master, ""
        time.sleep(POLL_S)


def _dial(procs: Processes, work: _Workdir, target: Endpoint, proxy: Endpoint | None,
          status) -> subprocess.Popen:
    key = work.key("id_target", target.private_key, "connection")
    proxy_key = work.key("id_proxy", proxy.private_key, "proxy") if proxy else None
    control = os.path.join(work.path, "ctl")
    argv = master_argv(target, proxy, key, proxy_key, control)
    limit = target.dial_error_limit
    delay, attempt = DIAL_DELAY_S, 0
    while True:
        master, error = _dial_once(procs, work, argv, control, target)
        if master is not None:
            work.drop_keys()  # authenticated: the master needs them no more
            return master
        dials = attempt + 1
        if limit > -1 and dials > limit:
            raise DialError(("proxy: " if proxy else "") + f"after {attempt} failed attempts: {error}")
        status(f"Dial {dials}/{'inf' if limit == -1 else limit} failed: retrying")
        if procs.closing.wait(min(delay, DIAL_MAX_DELAY_S)):
            raise Cancelled("the operation was cancelled while connecting")
        delay *= DIAL_BACKOFF
        attempt += 1


class _Output:
    """Collects a session's stdout and stderr and hands over each complete line as it arrives."""

    def __init__(self, on_line):
        self.on_line = on_line
        self.lock = threading.Lock()
        self.streams = {"stdout": bytearray(), "stderr": bytearray()}
        self.combined = bytearray()

    def pump(self, stream: str, fd) -> None:
        pending = b""
        while chunk := os.read(fd.fileno(), READ_BYTES):
            with self.lock:
                self.streams[stream] += chunk
                self.combined += chunk
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                self._emit(stream, line)
        if pending:
            self._emit(stream, pending)
        fd.close()

    def _emit(self, stream: str, line: bytes) -> None:
        # bufio.ScanLines: split on \n, drop one trailing \r
        self.on_line(stream, line.removesuffix(b"\r").decode(errors="replace"))


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        if data:
            proc.stdin.write(data)
        proc.stdin.close()
    except BrokenPipeError:  # the command exited without reading all of it
        pass


def run(procs: Processes, target: Endpoint, proxy: Endpoint | None, command: str, stdin: bytes,
        on_line, status) -> Result:
    """Runs `command` on `target`; `on_line(stream, line)` gets each output line as it comes, `status(msg)` the
    dial retry notices. Raises DialError or Cancelled; a non-zero exit status is returned, not raised."""
    work = _Workdir()
    master = None
    try:
        master = _dial(procs, work, target, proxy, status)
        control = os.path.join(work.path, "ctl")
        session = procs.start(session_argv(target, control, command), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        output = _Output(on_line)
        threads = [threading.Thread(target=_feed, args=(session, stdin), daemon=True),
                   threading.Thread(target=output.pump, args=("stdout", session.stdout), daemon=True),
                   threading.Thread(target=output.pump, args=("stderr", session.stderr), daemon=True)]
        for t in threads:
            t.start()
        status_code = session.wait()
        for t in threads:
            t.join()
        procs.finished(session)
        if procs.cancelled.is_set() or status_code < 0:
            raise Cancelled(f"the operation was cancelled while running {command!r}")
        return Result(status_code, bytes(output.streams["stdout"]), bytes(output.streams["stderr"]),
                      bytes(output.combined))
    finally:
        if master is not None:
            _stop(procs, master)
        work.drop_keys()
        work.remove()
