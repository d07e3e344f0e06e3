"""The one way this program reaches a node: every ssh option, the jump host and connection sharing.

The Docker provider's `sshOpts`, preflight's probe, scripts/status and the weights sync's hop between nodes all
take their ssh command lines from here. Building a command line has no side effect; SparkNode makes the folder of
the providers' shared connections before a provider connects.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from typing import Optional

from ..config.spec import ClusterSpec, NodeSpec, SshSpec

# `~` is expanded by ssh itself, so the provider's inputs are the same on every workstation.
CONTROL_DIR = "~/.cache/spark-vllm/ssh"
CONNECT_TIMEOUT_S = 15
ALIVE_INTERVAL_S = 15
# ssh exits 255 when it fails itself, and also when the remote command exits 255 or the connection drops while it
# runs. The remote shell prints this line first, so a 255 without it is a failure before the command ran.
STARTED = "spark-vllm: command started"
ATTEMPTS = 3
FIRST_BACKOFF_S = 1.0
# An ssh failure that a retry cannot mend: the answer would be the same.
PERMANENT = ("Permission denied", "Host key verification failed", "Could not resolve hostname",
             "Too many authentication failures")


def ssh_options(ssh: SshSpec, shared: bool = True) -> list[str]:
    """Options for the local `ssh` binary: as pulumi-docker runs it to reach a node's Docker daemon (`shared`), or
    as a probe runs it, on a connection of its own."""
    opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}",
            "-o", f"StrictHostKeyChecking={ssh.strict_host_key_checking}"]
    if not shared:
        opts += ["-o", "ControlPath=none"]  # over any the user's ssh_config sets
    elif ssh.control_persist_s:
        # pulumi-docker runs one ssh per Docker API connection; one shared connection a node (and hop) saves
        # a key exchange each time. ssh does not create the socket's folder: ensure_control_dir does.
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={CONTROL_DIR}/%C",
                 "-o", f"ControlPersist={ssh.control_persist_s}"]
    if ssh.known_hosts_file:
        opts += ["-o", f"UserKnownHostsFile={ssh.known_hosts_file}"]
    if ssh.key_file:
        opts += ["-o", "IdentitiesOnly=yes", "-i", ssh.key_file]
    return opts


def provider_ssh_opts(ssh: SshSpec, jump: Optional[NodeSpec], shared: bool = True) -> list[str]:
    """The Docker provider's `sshOpts` for a node, reached through `jump` when it is set; not `shared`, every hop
    opens a connection of its own."""
    opts = ssh_options(ssh, shared)
    if jump is not None:
        # A ProxyCommand carries every option to the jump hop too; `ssh -J` would drop the -o options there.
        # ssh expands %-tokens in a ProxyCommand: the hop's own tokens (%C) must reach it as written.
        hop = ["ssh", *(o.replace("%", "%%") for o in opts), "-p", str(jump.ssh_port), "-W", "%h:%p",
               f"{jump.ssh_user}@{jump.ssh_host}"]
        opts += ["-o", "ProxyCommand=" + shlex.join(hop)]
    return opts


def ensure_control_dir(ssh: SshSpec) -> None:
    """The folder of the shared connections' sockets; it must be private."""
    if ssh.control_persist_s:
        os.makedirs(os.path.expanduser(CONTROL_DIR), mode=0o700, exist_ok=True)


def jump_of(cluster: ClusterSpec, node: NodeSpec) -> Optional[NodeSpec]:
    """The node that `node` is reached through, if any."""
    return cluster.node(node.via) if node.via else None


def ssh_argv(ssh: SshSpec, node: NodeSpec, jump: Optional[NodeSpec], command: str) -> list[str]:
    """The local `ssh` command line that runs `command` on `node`, as the Docker provider reaches it, but over
    connections of its own: a shared connection whose link was cut answers nothing until ServerAlive gives up
    (45 s), so preflight and scripts/status would report a cut node late; and a command that follows (`tail -F`)
    would hand its output to the master ssh, which keeps it running after this ssh is stopped."""
    return ["ssh", *provider_ssh_opts(ssh, jump, shared=False), "-p", str(node.ssh_port),
            f"{node.ssh_user}@{node.ssh_host}", "--", command]


def _never_started(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == 255 and STARTED not in done.stderr


def run(ssh: SshSpec, node: NodeSpec, jump: Optional[NodeSpec], command: str, stdin: str = "",
        timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs a shell command on `node`, through `jump` when it is set; raises subprocess.TimeoutExpired after
    `timeout` s, retries included.

    A connection that fails before the command started is tried again, up to ATTEMPTS times with a doubling
    pause; a command that started is never run twice. Exit status 255 with the command not started means ssh
    could not reach the node, and stderr says why.
    """
    argv = ssh_argv(ssh, node, jump, f"echo {shlex.quote(STARTED)} >&2; {command}")
    deadline, pause = time.monotonic() + timeout, FIRST_BACKOFF_S
    for attempt in range(1, ATTEMPTS + 1):
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=max(deadline - time.monotonic(), 0.1))
        retry = _never_started(done) and not any(p in done.stderr for p in PERMANENT)
        done.stderr = "".join(line for line in done.stderr.splitlines(keepends=True) if line.rstrip() != STARTED)
        if not retry or attempt == ATTEMPTS or time.monotonic() + pause >= deadline:
            break
        time.sleep(pause)
        pause *= 2
    done.args = argv
    return done


def stream(ssh: SshSpec, node: NodeSpec, jump: Optional[NodeSpec], command: str) -> int:
    """Runs a command on `node` with this terminal's input and output until it ends, or Ctrl-C or SIGTERM stops it:
    for commands that follow (`tail -F`), which no timeout bounds. Returns its exit status."""
    # ssh holds this process's output: a SIGTERM that ended only this process would leave ssh running. The handler
    # is in place before ssh starts, so that a SIGTERM that comes while it starts is passed on too, once it has.
    started: list[subprocess.Popen] = []
    stopped: list[int] = []

    def on_sigterm(signum, frame) -> None:
        stopped.append(signum)
        for child in started:
            child.terminate()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        child = subprocess.Popen(ssh_argv(ssh, node, jump, command))
        started.append(child)
        if stopped:
            child.terminate()
        code = child.wait()
    except KeyboardInterrupt:
        for child in started:
            child.terminate()
        code = started[0].wait() if started else 128 + signal.SIGINT
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 - code if code < 0 else code


# AES-GCM first: the CPU's AES instructions carry it faster than OpenSSH's default ChaCha20 (in the lab, one stream
# of 1 GiB to node2: 755 MB/s against 512 MB/s); ChaCha20 stays for a peer without AES-GCM.
HOP_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"


def hop_ssh(node: NodeSpec, with_key: bool) -> list[str]:
    """ssh from one node to `node`, for a script that runs on a node (the weights sync, the image copy).

    The hop's key and known hosts are files in the folder $SPARK_VLLM_SSH_DIR of the running script (ssh expands
    it); host keys are accepted on first use into that run's own known_hosts.
    """
    hop = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
           "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}", "-o", "LogLevel=ERROR", "-o", f"Ciphers={HOP_CIPHERS}",
           "-o", "StrictHostKeyChecking=accept-new", "-o", "UserKnownHostsFile=${SPARK_VLLM_SSH_DIR}/known_hosts"]
    if with_key:
        hop += ["-o", "IdentitiesOnly=yes", "-o", "IdentityFile=${SPARK_VLLM_SSH_DIR}/key"]
    return hop + ["-p", str(node.ssh_port)]


# How rsync tells a file to copy: by size alone (weights placed by hand carry each node's own times), by size and time
# (a Hub download's files, each fetched anew with a new time, and copied with their times), or by SHA-256.
RSYNC_COMPARE = {"size": ["--size-only"], "size and time": [], "checksum": ["--checksum"]}


def rsync_argv(path: str, node: NodeSpec, host: str, compare: str, with_key: bool) -> list[str]:
    """rsync from this node's `path` to the same path on `node` at `host`, for a script that runs on a node, comparing
    files as RSYNC_COMPARE says.

    Links are copied as the files they point to (a Hugging Face cache snapshot is a folder of links into its blob
    store, which the other node does not have), and dot-files at the top (huggingface_hub's and spark-vllm's
    records under .cache/) are the source's own. A file that differs is sent whole: on the fabric that is faster than
    rsync's delta, which reads the file on both nodes to find what changed.
    """
    return ["rsync", "-a", "--whole-file", "--copy-links", "--exclude=/.*", *RSYNC_COMPARE[compare],
            f"--rsync-path=mkdir -p {shlex.quote(path)} && rsync", "-e", " ".join(hop_ssh(node, with_key)),
            f"{path}/", f"{node.ssh_user}@{host}:{path}/"]
