"""The watchdog through the real engine on the two-node lab, for both executors: a killed vLLM, a dead worker,
a wedged engine, rebooted nodes, a planned `up` while it watches, and a crash loop that it gives up on.

Each scenario ends with a completion answered, exactly the deployment's processes and containers on every node,
and `preview --refresh` finding no change. One stack per executor, shared by its scenarios in order; the printed
timings are the recovery times docs/watchdog.md reports.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from conftest import lab_stack, node_sh
from labstack import ROOT, LabStack, chat, planned
from test_faults import wait_for_ssh

# Short, for the lab: a wedge is found within FAILURES x (INTERVAL + PROBE_TIMEOUT).
WATCHDOG = {"enabled": "true", "intervalSeconds": 2, "probeTimeoutSeconds": 3, "failures": 2, "maxRestarts": 10,
            "windowSeconds": 3600, "backoff": {"initialSeconds": 1, "maxSeconds": 4}}
RECOVERY_S = 180  # the test's own bound on a recovery (the lab's load takes seconds)


@pytest.fixture(scope="module", params=["mp", "ray"])
def wd(request, lab2, tmp_path_factory):
    config = {f"watchdog.{key}" + (f".{sub}" if sub else ""): str(v) for key, value in WATCHDOG.items()
              for sub, v in (value.items() if isinstance(value, dict) else [(None, value)])}
    for s in lab_stack(tmp_path_factory, lab2, f"wd{request.param}", executor=request.param, config=config, up=True):
        yield s
    assert containers(s, 1) == containers(s, 2) == {}


def keeper(s: LabStack) -> str:
    return f"spark-vllm-{s.stack}-keeper"


def engine(s: LabStack, node: int) -> str:
    if s.executor == "mp":
        return f"spark-vllm-{s.stack}-vllm-rank{node - 1}"
    return f"spark-vllm-{s.stack}-ray-{'head' if node == 1 else 'worker'}"


def containers(s: LabStack, node: int) -> dict[str, str]:
    out = node_sh(node, f"docker ps -a --filter label=spark-vllm.stack={s.stack} --format '{{{{.Names}}}} "
                        "{{.State}}'")
    return dict(line.split() for line in out.splitlines())


def state(s: LabStack) -> dict:
    return json.loads(node_sh(1, f"docker exec {keeper(s)} cat /var/lib/spark-vllm/state.json"))


def journal(s: LabStack) -> list[str]:
    return node_sh(1, f"docker exec {keeper(s)} cat /var/lib/spark-vllm/watchdog.log", check=False).splitlines()


def answers(s: LabStack, timeout: float = 10) -> bool:
    out = s.outputs()
    try:
        return bool(chat(out["baseUrl"], out["servedModel"], timeout=timeout)["choices"][0]["message"]["content"])
    except OSError:
        return False


def wait_for_relaunch(s: LabStack, restarts: int, started: float) -> float:
    """Seconds from `started` until the keeper has made `restarts` relaunches and the API answers again."""
    deadline = started + RECOVERY_S
    while not (len((now := state(s))["restarts"]) >= restarts and now.get("phase") == "watching" and answers(s, 5)):
        assert time.monotonic() < deadline, (now, journal(s), logs(s))
        time.sleep(0.5)
    return time.monotonic() - started


def kill_vllm_on_the_head(s: LabStack) -> None:
    """kill -9 of the vLLM API server's process: mp's rank 0 (its container's own process), Ray's by its pid file."""
    if s.executor == "mp":
        node_sh(1, f"kill -9 $(docker inspect -f '{{{{.State.Pid}}}}' {engine(s, 1)})")
    else:
        node_sh(1, f"docker exec {engine(s, 1)} sh -c 'kill -9 $(cat /run/spark-vllm/serve.pid)'")


def is_vllm(args: str) -> bool:
    """`vllm serve ...` as the process runs it (python3 .../vllm serve), not a command line that mentions it."""
    parts = args.split()
    return any(part.endswith("/vllm") or part == "vllm" for part in parts[:2]) and "serve" in parts[1:3]


def status(s: LabStack) -> str:
    done = subprocess.run([str(ROOT / "scripts" / "status"), "--stack", s.stack], cwd=s.dir, env=s.env,
                          capture_output=True, text=True, timeout=180)
    return done.stdout + done.stderr


def logs(s: LabStack) -> str:
    return node_sh(1, f"docker logs --tail 30 {keeper(s)} 2>&1", check=False)


def assert_clean(s: LabStack) -> None:
    """Every container of the stack running, one vLLM per rank, one engine core, no zombie; preview no change."""
    for node in (1, 2):
        assert set(containers(s, node).values()) == {"running"}, containers(s, node)
        assert set(containers(s, node)) == {keeper(s), engine(s, node)}
    serves = {1: 1, 2: 1 if s.executor == "mp" else 0}
    for node, count in serves.items():
        ps = node_sh(node, "ps -eo stat=,args=")
        vllm = [line for line in ps.splitlines() if is_vllm(line.split(None, 1)[1])]
        assert not [line for line in ps.splitlines() if line.startswith("Z") and "vllm" in line], ps
        assert len([line for line in ps.splitlines() if "VLLM::EngineCore" in line]) == (node == 1), ps
        assert len(vllm) == count, (node, vllm)
    assert answers(s)
    s.pulumi("preview", "--refresh", "--expect-no-changes", check=True)


def test_up_arms_the_watchdog_and_no_op_up_changes_nothing(wd):
    assert answers(wd)
    deadline = time.monotonic() + 30
    while not ((now := state(wd)).get("armed") and now.get("lastProbe")):
        assert time.monotonic() < deadline, logs(wd)
        time.sleep(0.5)
    assert state(wd)["lastProbe"]["error"] is None and state(wd)["restarts"] == []
    assert_clean(wd)
    wd.up("--expect-no-changes")


def test_kill_9_of_vllm_on_the_head_is_relaunched(wd):
    started = time.monotonic()
    kill_vllm_on_the_head(wd)
    took = wait_for_relaunch(wd, 1, started)
    print(f"{wd.executor}: kill -9 of vLLM on the head, serving again after {took:.1f}s")
    assert "relaunch 1 of 10" in journal(wd)[-2] and "serving again" in journal(wd)[-1]
    # The serve's log before the kill, kept on the head's volume (Ray's rotated to serve.log.1 at the relaunch).
    kept = "serve.log" if wd.executor == "mp" else "serve.log.1"
    assert "Loading weights took" in node_sh(1, f"docker exec {keeper(wd)} cat /var/lib/spark-vllm/{kept}")
    assert_clean(wd)


def test_a_dead_worker_relaunches_the_whole_group(wd):
    before = len(state(wd)["restarts"])
    started = time.monotonic()
    node_sh(2, f"docker kill {engine(wd, 2)}")
    took = wait_for_relaunch(wd, before + 1, started)
    print(f"{wd.executor}: a dead worker, serving again after {took:.1f}s")
    last = state(wd)["restarts"][-1]
    # Seen first on the worker's report, or on the head: mp's rank 0 exits when a rank's connection drops.
    assert last["whole"] and "is not running" in last["reason"], last
    assert_clean(wd)


def test_a_wedged_engine_is_found_by_the_probe_and_relaunched(wd):
    before = len(state(wd)["restarts"])
    node_sh(1, "pkill -STOP -f 'VLLM::[E]ngineCore'")  # [E]: not this shell's own command line
    started = time.monotonic()
    took = wait_for_relaunch(wd, before + 1, started)
    print(f"{wd.executor}: a wedged engine (SIGSTOP), serving again after {took:.1f}s")
    assert "probes failed in a row" in state(wd)["restarts"][-1]["reason"]
    assert_clean(wd)
    shown = status(wd)
    assert re.search(r"watchdog\s+ok\s+armed, watching; last probe \d+ s ago, \d+\.\d\d s, answered; \d+ restart",
                     shown), shown
    assert re.search(r"restart\s+ok\s+\d+ s ago: \d probes failed in a row", shown), shown


@pytest.mark.parametrize("node", [2, 1], ids=["worker node", "head node"])
def test_a_rebooted_node_serves_again_without_up(wd, node):
    before = len(state(wd)["restarts"]) if node == 2 else None
    started = time.monotonic()
    subprocess.run(["docker", "restart", f"svl-lab-node{node}"], check=True, capture_output=True, timeout=120)
    wait_for_ssh(wd, node)
    if node == 1:
        wait_for_ssh(wd, 2)
    deadline = started + RECOVERY_S
    while not (answers(wd, 5) and (now := state(wd)).get("phase") == "watching"
               and (before is None or len(now["restarts"]) > before)):
        assert time.monotonic() < deadline, (logs(wd), journal(wd))
        time.sleep(1)
    print(f"{wd.executor}: node{node} rebooted, serving again after {time.monotonic() - started:.1f}s")
    assert f"-A INPUT -j svl-{wd.stack}-" in node_sh(node, "iptables -S INPUT")
    assert_clean(wd)


def test_a_planned_up_while_watching_is_not_fought(wd):
    before, lines = state(wd), len(journal(wd))
    wd.set_config("serve.maxModelLen", "2048")
    plan = planned(wd.pulumi("preview", check=True))
    assert plan.get("watchdog-arm") == "replace", plan
    wd.up()
    after = state(wd)
    # Disarmed before `up` replaced anything, armed again after: nothing relaunched, nothing counted.
    assert after["armed"] and after["token"] != before["token"] and after["restarts"] == []
    time.sleep(5)
    assert state(wd)["restarts"] == [] and len(journal(wd)) == lines, journal(wd)[lines:]
    assert_clean(wd)


def test_a_crash_loop_ends_in_gave_up_with_the_reason(wd):
    wd.pulumi("config", "set", "--path", "spark-vllm:watchdog.maxRestarts", "2", check=True)
    wd.up()
    node_sh(1, "mv /models/lab-tiny/config.json /models/lab-tiny/config.json.away")
    try:
        kill_vllm_on_the_head(wd)
        deadline = time.monotonic() + RECOVERY_S
        while not state(wd).get("gave_up"):
            assert time.monotonic() < deadline, (state(wd), logs(wd))
            time.sleep(1)
        gave_up = state(wd)["gave_up"]
        print(f"{wd.executor}: {gave_up}")
        assert gave_up.startswith("gave up after 2 restarts: ") and "not running" in gave_up, gave_up
        assert journal(wd)[-1].endswith(gave_up)
        time.sleep(6)  # it stays down: no third relaunch
        assert len(state(wd)["restarts"]) == 2 and not answers(wd, 3)
        shown = status(wd)
        assert re.search(r"watchdog\s+FAIL\s+gave up after 2 restarts", shown), shown
    finally:
        node_sh(1, "mv /models/lab-tiny/config.json.away /models/lab-tiny/config.json")
    # Once the cause is fixed, a plain `up` relaunches what the watchdog stopped and arms it again; preview says why.
    preview = wd.pulumi("preview", check=True)
    assert re.search(r"the watchdog gave up after 2 restarts: .*: up arms it again", preview.output), preview.output
    assert planned(preview).get("watchdog-arm") == "replace", planned(preview)
    wd.up()
    deadline = time.monotonic() + RECOVERY_S
    while not (answers(wd, 5) and state(wd).get("phase") == "watching"):
        assert time.monotonic() < deadline, (state(wd), logs(wd))
        time.sleep(1)
    assert not state(wd).get("gave_up")
    assert_clean(wd)
