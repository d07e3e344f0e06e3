"""The lab (lab/lab) for real: emulated Spark nodes, their networks, the inner image, and Ray across the fabric.

Needs root and a running docker daemon (skipped otherwise). The tests run in file order and share one lab;
the last one takes it down, so a lab a developer had up is gone afterwards (there is one lab per machine).
Expected names and addresses are those of notes/interfaces.md, written out here rather than read from the lab.
"""
import contextlib
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "lab" / "lab"
STATE = Path(os.environ.get("SPARK_VLLM_LAB_DIR") or Path.home() / ".cache/spark-vllm/lab")
SSH_CONFIG = STATE / "ssh_config"
INNER = "spark-vllm-lab/ray-vllm:2.60.0-double1"
FABRIC = {1: "10.87.200.11", 2: "10.87.200.12", 3: "10.87.200.13"}
MGMT1 = "172.29.87.11"
FIRST_UP_TIMEOUT_S = 3600   # a cold machine debootstraps two rootfs and pip-installs Ray
QUICK_UP_LIMIT_S = 30       # "a second up takes seconds"

MEASURED: list[dict] = []   # printed by conftest.py


def _docker_ok() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    if shutil.which("docker") is None:
        return "no docker client"
    try:
        subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return "docker daemon not reachable"
    return None


pytestmark = pytest.mark.skipif(_docker_ok() is not None, reason=f"lab: {_docker_ok()}")


def sh(args, timeout=120, check=True, input=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def lab(*args, timeout=600) -> subprocess.CompletedProcess:
    return sh([str(LAB), *args], timeout=timeout)


def ssh(host: str, command: str, *opts: str, timeout=60, check=True) -> subprocess.CompletedProcess:
    return sh(["ssh", "-F", str(SSH_CONFIG), *opts, host, command], timeout=timeout, check=check)


def host_used_mib() -> float:
    info = dict(re.findall(r"^(\w+):\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M))
    return (int(info["MemTotal"]) - int(info["MemAvailable"])) / 1024


def node_memory() -> dict[str, int]:
    """MiB charged to each node container's cgroup (v1 layout of this host), less inactive page cache."""
    result = {}
    for line in sh(["docker", "ps", "--format", "{{.ID}} {{.Names}}", "--no-trunc"]).stdout.splitlines():
        cid, name = line.split()
        group = Path(f"/sys/fs/cgroup/memory/docker/{cid}")
        if name.startswith("svl-lab-node") and group.exists():
            stat = dict(x.split() for x in (group / "memory.stat").read_text().splitlines())
            usage = int((group / "memory.usage_in_bytes").read_text()) - int(stat["total_inactive_file"])
            result[name] = round(usage / 2**20)
    return result


@contextlib.contextmanager
def measure(phase: str):
    before, t0 = host_used_mib(), time.monotonic()
    yield
    after = host_used_mib()
    MEASURED.append({"phase": phase, "seconds": time.monotonic() - t0, "host_used_mib": after,
                     "host_delta_mib": after - before, "nodes": node_memory()})


def snapshot() -> dict:
    """Everything a no-op `lab up` must leave exactly as it was."""
    names = sorted(n for n in sh(["docker", "ps", "-a", "--format", "{{.Names}}"]).stdout.split()
                   if n.startswith("svl-lab-"))
    return {
        "containers": {n: sh(["docker", "inspect", "-f", "{{.Id}} {{.State.StartedAt}} {{.Image}}", n]).stdout
                       for n in names},
        "networks": sh(["docker", "network", "ls", "--filter", "name=svl-lab-",
                        "--format", "{{.ID}} {{.Name}}"]).stdout,
        "volumes": sh(["docker", "volume", "ls", "--filter", "name=svl-lab-", "--format", "{{.Name}}"]).stdout,
        "inner": {n: inner_id(n) for n in names},
        "known_hosts": (STATE / "known_hosts").read_text(),
        "host_inner": sh(["docker", "image", "inspect", "-f", "{{.Id}}", INNER]).stdout,
    }


def inner_id(container: str) -> str:
    return sh(["docker", "exec", container, "docker", "image", "inspect", "-f", "{{.Id}}", INNER],
              check=False).stdout.strip()


def lab_objects() -> dict[str, list[str]]:
    def named(listing: str) -> list[str]:
        return [n for n in listing.split() if n.startswith("svl-lab-")]
    return {
        "containers": named(sh(["docker", "ps", "-a", "--format", "{{.Names}}"]).stdout),
        "networks": named(sh(["docker", "network", "ls", "--format", "{{.Name}}"]).stdout),
        "volumes": named(sh(["docker", "volume", "ls", "--format", "{{.Name}}"]).stdout),
        "links": named(" ".join(line.split(":")[1].strip().split("@")[0]
                                for line in sh(["ip", "-o", "link"]).stdout.splitlines())),
        "route": sh(["ip", "route", "show", "10.87.200.0/24"]).stdout.split(),
    }


@pytest.fixture(scope="module", autouse=True)
def lab_down_at_end():
    yield
    subprocess.run([str(LAB), "down"], capture_output=True, timeout=600)


def test_up_builds_or_reuses_everything():
    with measure("lab up (first; builds if cold)"):
        out = lab("up", timeout=FIRST_UP_TIMEOUT_S).stdout
    assert "lab up timings" in out and "inner image into nodes" in out


def test_second_up_is_quick_and_changes_nothing():
    before = snapshot()
    t0 = time.monotonic()
    with measure("lab up (again)"):
        out = lab("up", timeout=300).stdout
    elapsed = time.monotonic() - t0
    assert snapshot() == before
    assert "svl-lab-node1: kept" in out and "svl-lab-node2: kept" in out
    assert "already" in out and "up to date" in out
    assert elapsed < QUICK_UP_LIMIT_S, out


def test_third_node_joins_without_touching_the_others():
    before = snapshot()["containers"]
    with measure("lab up --nodes 3"):
        lab("up", "--nodes", "3", timeout=900)
    after = snapshot()
    for name in ("svl-lab-node1", "svl-lab-node2"):
        assert after["containers"][name] == before[name]
    assert "svl-lab-node3" in after["containers"]
    assert len(set(after["inner"].values())) == 1


def test_node1_has_mgmt_and_fabric_with_spark_names():
    addrs = ssh("svl-lab-node1", "ip -o -4 addr show").stdout
    assert re.search(rf"\benP7s7\s+inet {MGMT1}/24", addrs), addrs
    assert re.search(rf"\benp1s0f1np1\s+inet {FABRIC[1]}/24", addrs), addrs
    assert ssh("svl-lab-node1", "ip route show default").stdout.split()[:5] == \
        ["default", "via", "172.29.87.1", "dev", "enP7s7"]
    assert "mtu 9000" in ssh("svl-lab-node1", "ip link show enp1s0f1np1").stdout


@pytest.mark.parametrize("index", [2, 3])
def test_other_nodes_have_only_the_fabric(index):
    host = f"svl-lab-node{index}"
    addrs = ssh(host, "ip -o -4 addr show").stdout
    ifaces = {line.split()[1] for line in addrs.splitlines()}
    assert ifaces == {"lo", "enp1s0f1np1", "docker0"}, addrs   # docker0: the node's own dockerd
    assert f"inet {FABRIC[index]}/24" in addrs
    assert ssh(host, "ip route show default").stdout.strip() == ""


def test_host_reaches_fabric_only_through_node1():
    assert sh(["ip", "-o", "-4", "addr", "show", "to", "10.87.200.0/24"]).stdout == ""
    assert sh(["ip", "-o", "addr", "show", "dev", "svl-lab-fabric"]).stdout == ""   # not even IPv6 link-local
    assert sh(["ip", "route", "show", "10.87.200.0/24"]).stdout.startswith("unreachable 10.87.200.0/24")
    for port in (22, 6379):
        with socket.socket() as s, pytest.raises(OSError) as err:
            s.settimeout(3)
            s.connect((FABRIC[2], port))
        assert err.value.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH), err.value
    direct = ssh(FABRIC[2], "true", "-o", "ProxyJump=none", check=False, timeout=30)
    assert direct.returncode == 255 and "No route to host" in direct.stderr
    assert ssh(FABRIC[2], "hostname", "-J", "svl-lab-node1").stdout.strip() == "svl-lab-node2"
    proxy = f"ProxyCommand=ssh -F {SSH_CONFIG} -W %h:%p svl-lab-node1"
    assert ssh(FABRIC[3], "hostname", "-o", "ProxyJump=none", "-o", proxy).stdout.strip() == "svl-lab-node3"
    assert ssh("svl-lab-node3", "hostname").stdout.strip() == "svl-lab-node3"   # the generated alias


def test_sshd_is_key_only_root_and_a_jump_host():
    settings = dict(line.split(" ", 1) for line in ssh("svl-lab-node2", "sshd -T").stdout.splitlines() if " " in line)
    assert settings["permitrootlogin"] == "without-password"
    assert settings["passwordauthentication"] == "no"
    assert settings["allowtcpforwarding"] == "yes"
    keys = [line.split()[2] for line in (STATE / "known_hosts").read_text().splitlines()]
    assert len(keys) == 3 and len(set(keys)) == 3, "each node makes its own host key at first boot"


def test_each_node_runs_its_own_dockerd_on_overlay2():
    for i in FABRIC:
        info = ssh(f"svl-lab-node{i}", "docker info -f '{{.Driver}} {{.CgroupVersion}} {{.Name}}'").stdout.split()
        assert info == ["overlay2", "1", f"svl-lab-node{i}"]


def test_models_are_identical_on_every_node():
    listing = "cd /models && sha256sum lab-tiny/* lab-tiny-bad-arch/* && test -d /root/.cache/huggingface"
    sums = {i: ssh(f"svl-lab-node{i}", listing).stdout for i in FABRIC}
    assert sums[1] == sums[2] == sums[3]
    shards = re.findall(r"lab-tiny/model-0000\d-of-00004\.safetensors", sums[1])
    assert len(shards) == 4
    config = json.loads(ssh("svl-lab-node2", "cat /models/lab-tiny/config.json").stdout)
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    bad = json.loads(ssh("svl-lab-node2", "cat /models/lab-tiny-bad-arch/config.json").stdout)
    assert bad["architectures"] != config["architectures"]


def test_up_puts_back_the_checkpoints_a_test_or_an_interrupted_run_changed():
    listing = "cd /models && sha256sum lab-tiny/* lab-tiny-bad-arch/*"
    intact = ssh("svl-lab-node2", listing).stdout
    before = snapshot()["containers"]
    # What an interrupted crash-loop scenario leaves (test_watchdog moves config.json away), and a stray edit.
    ssh("svl-lab-node1", "mv /models/lab-tiny/config.json /models/lab-tiny/config.json.away")
    ssh("svl-lab-node3", "rm /models/lab-tiny/model-00002-of-00004.safetensors && "
                         "echo x >> /models/lab-tiny-bad-arch/config.json")
    out = lab("up", "--nodes", "3", timeout=300).stdout
    assert "svl-lab-node1: restored /models from the node image; these differed: /models/lab-tiny/config.json, " \
           "/models/lab-tiny/config.json.away" in out, out
    assert "svl-lab-node3: restored /models" in out and "svl-lab-node2: restored" not in out, out
    assert {i: ssh(f"svl-lab-node{i}", listing).stdout for i in FABRIC} == {i: intact for i in FABRIC}
    assert not ssh("svl-lab-node1", "ls /models/lab-tiny/config.json.away", check=False).stdout
    assert snapshot()["containers"] == before  # put back in place: no node restarted


def test_inner_image_has_the_same_id_on_every_node():
    host = sh(["docker", "image", "inspect", "-f", "{{.Id}}", INNER]).stdout.strip()
    assert host.startswith("sha256:")
    assert {i: inner_id(f"svl-lab-node{i}") for i in FABRIC} == {i: host for i in FABRIC}
    versions = ssh("svl-lab-node3", f"docker run --rm --network none {INNER} sh -c "
                   "'ray --version && vllm --help >/dev/null && python -c \"import vllm; print(vllm.__version__)\" "
                   "&& curl --version | head -1 && test ! -e /run/svl-build'", timeout=120).stdout
    assert "ray, version 2.60.0" in versions and "double" in versions and "curl" in versions


def _memlock_flag(host: str) -> str:
    """The node's hard memlock limit: inner containers cannot ask for more (see lab/README.md)."""
    hard = ssh(host, "ulimit -H -l").stdout.strip()
    return "-1" if hard == "unlimited" else f"{int(hard) * 1024}"


def _ray_run(host: str, name: str, ray_args: str) -> None:
    ssh(host, f"docker rm -f {name} >/dev/null 2>&1; docker run -d --name {name} --network host --ipc host "
              f"--shm-size 1g --ulimit memlock={_memlock_flag(host)} --ulimit stack=67108864 {INNER} "
              f"ray start {ray_args} --num-gpus=1 --object-store-memory=268435456 --block")


def _alive_ray_nodes() -> list[str] | None:
    probe = ("import json, ray; ray.init(address='auto', logging_level='ERROR'); "
             "print(json.dumps(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))")
    proc = ssh("svl-lab-node1", f"docker exec lab-test-ray-head python -c \"{probe}\"", check=False, timeout=60)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None


def test_ray_cluster_spans_the_fabric():
    workers = {i: f"svl-lab-node{i}" for i in FABRIC if i != 1}
    try:
        with measure("ray: head + 2 workers up"):
            _ray_run("svl-lab-node1", "lab-test-ray-head", f"--head --node-ip-address={FABRIC[1]} --port=6379")
            for host in workers.values():
                _ray_run(host, "lab-test-ray-worker", f"--address={FABRIC[1]}:6379")
            deadline, nodes = time.monotonic() + 180, None
            while time.monotonic() < deadline and nodes != sorted(FABRIC.values()):
                time.sleep(0.5)
                nodes = _alive_ray_nodes()
        assert nodes == sorted(FABRIC.values()), f"alive Ray nodes: {nodes}"
        # `ray status` is the autoscaler's view, which catches up with the GCS's list of nodes a moment later.
        status = ssh("svl-lab-node1", "docker exec lab-test-ray-head ray status", check=False).stdout
        while "0.0/3.0 GPU" not in status and time.monotonic() < deadline:
            time.sleep(0.5)
            status = ssh("svl-lab-node1", "docker exec lab-test-ray-head ray status", check=False).stdout
        assert "0.0/3.0 GPU" in status, status
    finally:
        with measure("ray: containers removed"):
            for host in ["svl-lab-node1", *workers.values()]:
                ssh(host, "docker rm -f lab-test-ray-head lab-test-ray-worker >/dev/null 2>&1; true", check=False)


def test_status_reports_every_node_healthy():
    out = lab("status", timeout=120).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith("svl-lab-node")]
    host = sh(["docker", "image", "inspect", "-f", "{{.Id}}", INNER]).stdout.strip()[7:19]
    assert [r[:6] for r in rows] == [
        ["svl-lab-node1", MGMT1, FABRIC[1], "ok", rows[0][4], host],
        ["svl-lab-node2", "-", FABRIC[2], "ok", rows[0][4], host],
        ["svl-lab-node3", "-", FABRIC[3], "ok", rows[0][4], host],
    ]
    assert "unreachable" in out


NODE_VOLUME = re.compile(r"svl-lab-node\d+-docker")


def test_down_leaves_nothing_but_the_nodes_volumes_and_is_idempotent():
    # What a crashed run leaves in a node's engine, which the next `up` must clear.
    ssh("svl-lab-node1", "docker volume create leftover && docker create --name leftover -v leftover:/x "
                         f"{INNER} true")
    with measure("lab down"):
        out = lab("down", timeout=600).stdout
    left = lab_objects()
    # Node volumes of larger labs (the bench's eight nodes) may outlive this module's three: they are kept alike.
    kept = [v for v in left["volumes"] if NODE_VOLUME.fullmatch(v)]
    assert {f"svl-lab-node{i}-docker" for i in (1, 2, 3)} <= set(kept)
    assert f"kept the nodes' volumes, with their images: {', '.join(kept)}" in out, out
    assert left == {"containers": [], "networks": [], "volumes": kept, "links": [], "route": []}
    assert not SSH_CONFIG.exists()
    assert "nothing (lab was already down)" in lab("down", timeout=120).stdout
    assert sh([str(LAB), "status"], check=False).returncode == 1


def test_up_on_the_kept_volumes_loads_no_image_and_starts_each_engine_empty():
    with measure("lab up (nodes' volumes kept)"):
        out = lab("up", timeout=600).stdout
    for node in (1, 2):
        assert f"svl-lab-node{node}: created on its kept volume" in out, out
        assert f"svl-lab-node{node}: inner image already" in out, out
        engine = ssh(f"svl-lab-node{node}", "docker ps -aq; docker volume ls -q; docker images -q " + INNER).stdout
        assert engine.split() == [inner_id(f"svl-lab-node{node}")[7:19]], engine
