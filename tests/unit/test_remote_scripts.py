"""The scripts that run on the nodes, exercised here against local stand-ins (the lab runs them for real)."""

from __future__ import annotations

import http.server
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.remote import cluster_ready
from components.remote.serve_ready import load_progress, progress_text

SERVE_READY = Path(cluster_ready.__file__).with_name("serve_ready.py")
EXPECTED = {"spark1": "192.168.200.1", "spark2": "192.168.200.2"}
MGMT = {"spark1": "10.10.10.11"}


def test_cluster_ready_when_exactly_the_expected_nodes_and_gpus():
    assert cluster_ready.diagnose([("192.168.200.1", 1), ("192.168.200.2", 1)], EXPECTED, MGMT, 2, "eth9") == (True, [])


def test_cluster_ready_names_a_missing_node():
    ready, problems = cluster_ready.diagnose([("192.168.200.1", 1)], EXPECTED, MGMT, 2, "enp1s0f1np1")
    assert not ready
    assert problems == ["spark2 (192.168.200.2) has not joined: check that 192.168.200.2 is spark2's address on "
                        "enp1s0f1np1 and that its Ray worker container is running"]


def test_cluster_ready_names_a_node_registered_with_an_address_that_is_not_its_own():
    ready, problems = cluster_ready.diagnose([("192.168.200.1", 1), ("192.168.200.2", 1)], EXPECTED, MGMT, 2,
                                             "enp1s0f1np1", unreachable={"192.168.200.2"})
    assert not ready
    assert problems == ["spark2 registered with 192.168.200.2, but the head cannot reach its raylet there: "
                        "192.168.200.2 is probably not spark2's address on enp1s0f1np1; fix its fabricIp"]


def test_raylets_by_ip_tells_a_replaced_raylet_from_an_address_nobody_has(monkeypatch):
    """A replaced worker's old raylet stays alive in Ray at the same IP until its heartbeats lapse: its port refuses,
    the new one's answers. Only an address where nothing answers at all is silent (not connected to here)."""
    with socket.create_server(("127.0.0.1", 0)) as gone:
        closed = gone.getsockname()[1]
    real = socket.create_connection

    def connect(address, timeout):
        if address[0] == "192.0.2.9":
            raise TimeoutError("timed out")
        return real(address, timeout)

    monkeypatch.setattr(cluster_ready.socket, "create_connection", connect)
    with socket.create_server(("127.0.0.1", 0)) as up:
        nodes = [("127.0.0.1", closed), ("127.0.0.1", up.getsockname()[1]), ("127.0.0.3", closed),
                 ("192.0.2.9", 6379)]
        states = cluster_ready.raylets_by_ip([{"NodeManagerAddress": ip, "NodeManagerPort": port}
                                             for ip, port in nodes])
    assert states == {"127.0.0.1": "up", "127.0.0.3": "refused", "192.0.2.9": "silent"}


def test_cluster_ready_names_the_seeds_management_ip_failure():
    ready, problems = cluster_ready.diagnose([("10.10.10.11", 1), ("192.168.200.2", 1)], EXPECTED, MGMT, 2, "eth9")
    assert not ready
    assert any("registered with spark1's management IP 10.10.10.11 instead of its fabric IP 192.168.200.1" in p
               and "seed's failure" in p and "--node-ip-address=192.168.200.1" in p for p in problems)


def test_cluster_ready_names_an_unexpected_node_and_gpu_shortfall():
    _, problems = cluster_ready.diagnose([("192.168.200.1", 1), ("192.168.200.2", 1), ("192.168.200.9", 1)],
                                         EXPECTED, MGMT, 2, "eth9")
    assert any("unexpected Ray node registered with IP 192.168.200.9" in p for p in problems)
    _, problems = cluster_ready.diagnose([("192.168.200.1", 1), ("192.168.200.2", 0)], EXPECTED, MGMT, 2, "eth9")
    assert problems == ["Ray sees 1 GPUs, expected 2: check --num-gpus and the GPU runtime"]


def test_cluster_ready_names_a_head_whose_address_is_not_on_the_fabric():
    """The seed's case for Ray: the head's fabricIp set to its management address. The cause is the head."""
    assert cluster_ready.head_problem("spark1", "10.10.10.11", "enp1s0f1np1", ["192.168.200.1"]) == (
        "the head spark1's fabricIp 10.10.10.11 is not an address of enp1s0f1np1 on spark1 (enp1s0f1np1 has "
        "192.168.200.1): Ray's GCS is advertised there, so the workers cannot join over the fabric; set spark1's "
        "fabricIp to its address on enp1s0f1np1")
    assert "(enp1s0f1np1 has no IPv4 address)" in cluster_ready.head_problem("spark1", "10.10.10.11", "enp1s0f1np1", [])
    assert cluster_ready.head_problem("spark1", "10.10.10.11", "eth9", None) == (
        "the head spark1 has no interface eth9: Ray's nodes meet over the fabric; fix fabricInterface")
    assert cluster_ready.head_problem("spark1", "192.168.200.1", "eth9", ["10.0.0.1", "192.168.200.1"]) is None


def test_cluster_ready_reads_an_interfaces_addresses_from_the_kernel():
    assert "127.0.0.1" in cluster_ready.interface_addresses("lo")
    assert cluster_ready.interface_addresses("no-such-if0") is None


GIB = 2 ** 30


# Each loader's bar as vLLM 0.33 prints it (weight_utils.py's _BAR_FORMAT; fastsafetensors' own bar has the same
# format): a Ray worker's lines carry its prefix. The InstantTensor lines are from a user's log (184G in 23 s).
@pytest.mark.parametrize("line, expected", [
    ("Loading safetensors checkpoint shards:  44% Completed | 17/39 [05:06<06:36, 18.01s/it]", ("shards", 17, 39)),
    ("Loading safetensors checkpoint shards (eager): 100% Completed | 4/4 [00:02<00:00,  1.90it/s]",
     ("shards", 4, 4)),
    ("(RayWorkerWrapper pid=1159) Multi-thread loading shards:  25% Completed | 1/4 [00:01<00:03,  1.00s/it]",
     ("shards", 1, 4)),
    ("Loading pt checkpoint shards:  50% Completed | 2/4 [00:04<00:04,  2.00s/it]", ("shards", 2, 4)),
    ("Loading fastsafetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.90it/s]",
     ("shard batches", 2, 4)),
    ("Loading safetensors using Runai Model Streamer:  10% Completed | 30/300 [00:02<00:18, 15.00it/s]",
     ("tensors", 30, 300)),
    ("Loading safetensors using InstantTensor loader:   0% Completed | 0.00/155G [00:00<?, ?B/s]",
     ("bytes", 0, 155 * GIB)),
    ("(Worker_TP0_EP0 pid=1159) Loading safetensors using InstantTensor loader: 100% Completed | 184G/184G "
     "[00:23<00:00, 8.41GB/s]", ("bytes", 184 * GIB, 184 * GIB)),
    ("Loading safetensors using InstantTensor loader:  50% Completed | 512M/1.00G [00:01<00:01, 537MB/s]",
     ("bytes", 512 * 2 ** 20, GIB)),
    ("INFO 12-02 [default_loader.py:1] Loading weights took 549.60 seconds", None),
    ("INFO 12-02 Loading model from /models/x", None),
])
def test_load_progress_reads_every_loaders_bar(line, expected):
    assert load_progress(line) == expected


def test_progress_text_counts_what_the_loader_counts():
    assert progress_text(("shards", 17, 39), 39 * GIB, 0.5) == ("loading weights 17/39 shards", "")
    assert progress_text(("shards", 2, 4), 8e9, 2.0) == ("loading weights 2/4 shards", ", ~2.00 GB/s")
    # Bytes come from the bar itself, not from the checkpoint's size.
    assert progress_text(("bytes", 184 * GIB, 184 * GIB), 1, 23.0) == ("loading weights 184.0/184.0 GiB",
                                                                        ", ~8.59 GB/s")
    # A checkpoint under a GiB (the lab's) in MiB, not as 0.0/0.0 GiB.
    assert progress_text(("bytes", 2 << 20, 8 << 20), 1, 0.5) == ("loading weights 2.0/8.0 MiB", "")


def running(pid: str) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_serve_ctl_stops_the_whole_process_group_and_counts_zombies_as_dead(tmp_path):
    ctl = (Path(cluster_ready.__file__).with_name("serve_ctl.sh")).read_text()
    pid_file, env_file = tmp_path / "serve.pid", tmp_path / "serve.env"
    env_file.write_text("VLLM_API_KEY=x\n")

    def run(action: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", ctl, "serve-ctl", action, str(pid_file), str(env_file)],
                              capture_output=True, text=True, timeout=30)

    # A group leader that ignores nothing and a child in its group, as `setsid vllm serve` leaves them.
    group = subprocess.Popen(["setsid", "sh", "-c", "sleep 300 & exec sleep 301"])
    pid_file.write_text(str(group.pid))
    time.sleep(0.3)
    children = subprocess.run(["pgrep", "-g", str(group.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) == 2
    alive = run("alive")
    assert alive.returncode == 0 and alive.stdout.strip() == str(group.pid)
    start = time.monotonic()
    # The leader is our child, so it stays a zombie until we reap it: the stop must not wait 60 s for it.
    done = run("stop")
    assert done.returncode == 0 and time.monotonic() - start < 5
    assert [pid for pid in children if running(pid)] == []
    assert not pid_file.exists() and not env_file.exists()
    assert run("alive").returncode != 0  # no pid file: no serve
    group.wait()
    assert run("stop").returncode == 0


def test_serve_ctl_counts_a_zombie_as_dead(tmp_path):
    ctl = (Path(cluster_ready.__file__).with_name("serve_ctl.sh")).read_text()
    pid_file = tmp_path / "serve.pid"
    child = subprocess.Popen(["true"])  # not waited for: a zombie until group.wait()
    time.sleep(0.3)
    pid_file.write_text(str(child.pid))
    alive = subprocess.run(["sh", "-c", ctl, "serve-ctl", "alive", str(pid_file)], capture_output=True, text=True)
    assert alive.returncode != 0 and alive.stdout == ""
    child.wait()


def test_serve_ctl_stop_is_not_fooled_by_a_serve_reaped_while_it_looks(tmp_path):
    """CI saw `did not stop` a second after a stop began: the serve died, the check saw its zombie, and Docker's
    init reaped it between the check's two reads of /proc, so the last check counted it alive. Here a busy
    init reaps each serve 0-6 ms after it dies; with two reads about one stop in seven failed."""
    ctl = (Path(cluster_ready.__file__).with_name("serve_ctl.sh")).read_text()
    pid_file, env_file = tmp_path / "serve.pid", tmp_path / "serve.env"

    def reap_late(serve: subprocess.Popen) -> None:
        while running(str(serve.pid)):
            time.sleep(0.0002)
        time.sleep(random.uniform(0, 0.006))
        serve.wait()

    failed = []
    for _ in range(50):
        serve = subprocess.Popen(["setsid", "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"])
        threading.Thread(target=reap_late, args=(serve,), daemon=True).start()
        time.sleep(0.05)
        pid_file.write_text(str(serve.pid))
        done = subprocess.run(["sh", "-c", ctl, "serve-ctl", "stop", str(pid_file), str(env_file)],
                              capture_output=True, text=True, timeout=30)
        failed += [done.stderr] if done.returncode else []
        serve.wait()
    assert failed == []


class FakeVllm:
    """A local HTTP server and log that behave like a loading vLLM, for serve_ready.py to watch."""

    def __init__(self, tmp_path: Path, shards: int, delay: float, took_late: bool = False):
        """took_late: vLLM's "Loading weights took" line is written while the first /health answered is on its way,
        after that round's log read (vLLM listens before it loads)."""
        self.log = tmp_path / "serve.log"
        self.log.write_text("")
        self.env = tmp_path / "serve.env"
        self.env.write_text("VLLM_API_KEY='k1'\n")
        self.model = tmp_path / "model"
        self.model.mkdir()
        for i in range(shards):
            (self.model / f"model-{i:05d}.safetensors").write_bytes(b"x" * 1000)
        self.process = subprocess.Popen(["sleep", "120"])
        self.pid = tmp_path / "serve.pid"
        self.pid.write_text(str(self.process.pid))
        self.loaded = threading.Event()
        self.completion_status = 200  # what one chat completion answers once loaded
        self.completions = []
        self.took_late = took_late
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.completions.append((self.path, self.headers.get("Authorization"), body))
                status = fake.completion_status if fake.loaded.is_set() else 503
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_GET(self):
                if not fake.loaded.is_set():
                    self.send_error(503)
                elif self.path == "/health":
                    if fake.took_late:
                        fake.took_late = False
                        fake.write_took()
                    self.send_response(200)
                    self.end_headers()
                elif self.headers.get("Authorization") != "Bearer k1":
                    self.send_error(401)
                else:
                    body = json.dumps({"data": [{"id": "tiny"}]}).encode()
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.writer = threading.Thread(target=self._load, args=(shards, delay), daemon=True)

    def _load(self, shards, delay):
        for k in range(1, shards + 1):
            time.sleep(delay)
            with self.log.open("a") as f:
                f.write(f"Loading safetensors checkpoint shards: {100 * k // shards:3d}% Completed | "
                        f"{k}/{shards} [00:0{k}<00:00,  1.00it/s]\n")
        if not self.took_late:
            self.write_took()
        self.loaded.set()

    def write_took(self):
        with self.log.open("a") as f:
            f.write("INFO 12-02 10:00:00 [default_loader.py:1] Loading weights took 1.50 seconds\n")

    def wait(self, timeout: float, model: str = "tiny", docker: Path | None = None) -> subprocess.CompletedProcess:
        """serve_ready.py on the fake: Ray's form (a pid and a log file), or with `docker`, the folder of a fake
        `docker`, mp's (rank 0's container named, seen through that `docker`)."""
        if docker is None:
            watched, env = [f"--log={self.log}", f"--pid-file={self.pid}", f"--env-file={self.env}"], None
        else:
            watched, env = ["--container=rank0"], {**os.environ, "PATH": f"{docker}{os.pathsep}{os.environ['PATH']}"}
        return subprocess.run([sys.executable, str(SERVE_READY), "--node=node1", f"--url={self.url}",
                               f"--model={model}", f"--model-path={self.model}", *watched, f"--timeout={timeout}",
                               "--heartbeat=1"], capture_output=True, text=True, timeout=timeout + 30, env=env)

    def close(self):
        self.server.shutdown()
        self.process.kill()
        self.process.wait()


def fake_docker(tmp_path: Path, fake: FakeVllm) -> tuple[Path, Path]:
    """A `docker` for container `rank0`, whose process is the fake's: logs (followed until it exits), inspect, and
    a journal of every call. Returns (its folder, the journal)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "docker-calls"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
pid=$(cat {fake.pid})
case "$*" in
  "logs --follow rank0") exec tail -n +1 -f --pid="$pid" {fake.log} ;;
  "logs --tail "*" rank0") exec tail -n "$3" {fake.log} ;;
  "inspect -f {{{{json .}}}} rank0")
    if kill -0 "$pid" 2>/dev/null; then running=true; else running=false; fi
    echo '{{"State": {{"Running": '$running'}}, "Config": {{"Env": ["VLLM_API_KEY=k1"]}}}}' ;;
  *) echo "fake docker: $*" >&2; exit 1 ;;
esac
""")
    script.chmod(0o755)
    return bin_dir, calls


def test_serve_ready_follows_a_containers_log_with_one_docker_call_not_one_a_round(tmp_path):
    """mp: the progress comes from `docker logs --follow`; the rounds (a quarter second each) ask Docker nothing."""
    fake = FakeVllm(tmp_path, shards=4, delay=0.6)
    bin_dir, calls = fake_docker(tmp_path, fake)
    try:
        fake.writer.start()
        done = fake.wait(timeout=30, docker=bin_dir)
    finally:
        fake.close()
    assert done.returncode == 0, done.stderr
    for k in (1, 2, 3, 4):
        assert f"loading weights {k}/4 shards" in done.stdout
    assert "vllm: INFO 12-02 10:00:00 [default_loader.py:1] Loading weights took 1.50 seconds" in done.stdout
    # The API key from one inspect, the log from one follower, over about ten rounds.
    assert sorted(calls.read_text().splitlines()) == ["inspect -f {{json .}} rank0", "logs --follow rank0"]


def test_serve_ready_reports_a_stopped_container_with_its_log_tail(tmp_path):
    fake = FakeVllm(tmp_path, shards=4, delay=0.6)
    fake.log.write_text("ValueError: Invalid repository ID or local directory specified: '/models/nope'\n")
    bin_dir, _ = fake_docker(tmp_path, fake)
    threading.Timer(1.0, lambda: (fake.process.kill(), fake.process.wait())).start()  # reaped: no zombie left
    try:
        done = fake.wait(timeout=30, docker=bin_dir)
    finally:
        fake.close()
    assert done.returncode == 1
    assert "vllm serve on node1 exited while starting. Last lines of `docker logs rank0`:" in done.stderr
    assert "/models/nope" in done.stderr


@pytest.fixture
def fake(tmp_path):
    f = FakeVllm(tmp_path, shards=4, delay=0.6)
    yield f
    f.close()


def test_serve_ready_shows_shard_progress_then_succeeds(fake):
    fake.writer.start()
    done = fake.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    for k in (1, 2, 3, 4):
        assert f"loading weights {k}/4 shards" in done.stdout
    assert "GB/s" in done.stdout and "vllm: INFO" in done.stdout
    assert done.stdout.count("loading weights 4/4 shards") == 1
    assert "ready: tiny served at" in done.stdout
    path, auth, body = fake.completions[-1]
    assert (path, auth, body["model"], body["max_tokens"]) == ("/v1/chat/completions", "Bearer k1", "tiny", 1)


def test_serve_ready_relays_the_load_line_written_after_its_last_log_read(tmp_path):
    """The stack's `load` output is read from this line in the gate's output (stop 32's bench: `load` was {})."""
    fake = FakeVllm(tmp_path, shards=2, delay=0.1, took_late=True)
    try:
        fake.writer.start()
        done = fake.wait(timeout=30)
    finally:
        fake.close()
    assert done.returncode == 0, done.stderr
    assert "vllm: INFO 12-02 10:00:00 [default_loader.py:1] Loading weights took 1.50 seconds" in done.stdout
    assert done.stdout.index("Loading weights took") < done.stdout.index("ready: tiny served at")


def test_serve_ready_needs_one_completion_not_only_the_listing(fake):
    """/health and /v1/models stay up while the engine is wedged (vllm issue 36960)."""
    fake.completion_status = 500
    fake.writer.start()
    done = fake.wait(timeout=5)
    assert done.returncode == 1
    assert "tiny is listed, but one completion answered 500" in done.stderr


def test_serve_ready_reports_a_dead_process_with_the_log_tail(fake):
    fake.log.write_text("ValueError: Invalid repository ID or local directory specified: '/models/nope'\n")
    fake.process.kill()
    fake.process.wait()
    done = fake.wait(timeout=30)
    assert done.returncode == 1
    assert "vllm serve on node1 exited while starting" in done.stderr
    assert "/models/nope" in done.stderr


def test_serve_ready_times_out_naming_a_live_but_unready_process(fake):
    start = time.monotonic()
    done = fake.wait(timeout=3)
    assert done.returncode == 1 and time.monotonic() - start < 15
    assert f"still running (pid {fake.process.pid}) but not ready after 0m03s" in done.stderr
    assert "still waiting: starting" in done.stdout


def test_serve_ready_waits_for_the_served_model_in_v1_models(fake):
    fake.writer.start()
    done = fake.wait(timeout=4, model="other")
    assert done.returncode == 1
    assert "/v1/models answered 200 with ['tiny']" in done.stderr
