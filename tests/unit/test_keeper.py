"""The keeper's protocol (components/remote/keeper.py) in one process: a leader and a follower on loopback, their
Docker a fake that records every stop and start, the API a local server that answers, fails or hangs.

The lab (tests/e2e/test_watchdog.py) runs the same program against real containers, processes and signals.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.remote import keeper


class FakeDocker:
    """Containers by name: running or not; every stop and start in order; `crash` makes a start die at once."""

    def __init__(self, events: list, names):
        self.up = {name: True for name in names}
        self.events, self.crash, self.serve = events, set(), True

    def serving(self):  # the head's process: the follower's death is found by its report, not the probe
        return self.up["rank0"] and self.serve

    def logs(self, name):
        return f"the log of {name}\n".encode()

    def exec(self, name, argv, timeout=120):
        """Ray's head: the env file, `ray status`, and serve_ctl.sh's actions on a serve that is only a flag."""
        if argv[0] == "rm":
            return 0, ""
        if argv[0] == "cat":
            return 0, "VLLM_API_KEY='k'\n"
        if argv[0] == "ray":
            return 0, "".join(f" 1 node_{n}\n" for n, running in self.up.items() if running)
        action = argv[4]
        if action == "alive":
            return (0 if self.serve else 1), ""
        if action == "stop-keep" and self.serve:
            self.events.append(("stop", "serve"))
        if action == "relaunch":
            self.events.append(("start", "serve"))
        self.serve = action == "relaunch"
        return 0, ""

    def running(self, name):
        return self.up[name]

    def inspect(self, name):
        return {"State": {"Running": self.up[name]}, "Config": {"Env": ["VLLM_API_KEY=k"]}}

    def stop(self, name):
        if self.up[name]:
            self.events.append(("stop", name))
        self.up[name] = False

    def start(self, name):
        self.events.append(("start", name))
        self.up[name] = name not in self.crash


class Api:
    """A completion endpoint: `mode` is "ok", "fail" or "hang"; it answers only while rank0 runs."""

    def __init__(self, docker: FakeDocker):
        api = self
        self.mode, self.keys = "ok", []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                api.keys.append(self.headers.get("Authorization"))
                if api.mode == "hang":
                    time.sleep(3)
                ok = api.mode == "ok" and docker.serving()
                data = json.dumps({"choices": [{"text": "pong"}]} if ok else {}).encode()
                self.send_response(200 if ok else 500)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["mp"])
def group(request, tmp_path, monkeypatch):
    executor = request.param
    events: list = []
    docker = FakeDocker(events, ["rank0", "rank1"])
    monkeypatch.setattr(keeper, "STALE_S", 5)
    api, port = Api(docker), free_port()
    common = {"stack": "t", "executor": executor}
    lead_dir, follow_dir = tmp_path / "n1", tmp_path / "n2"
    lead_dir.mkdir()
    follow_dir.mkdir()
    leader = keeper.Leader({**common, "role": "leader", "node": "n1", "stateDir": str(lead_dir),
                            "containers": ["rank0"], "bind": "127.0.0.1", "port": port, "followers": ["n2"],
                            "api": {"host": "127.0.0.1", "port": api.server.server_address[1], "model": "m"},
                            "watchdog": {"interval": 1, "probeTimeout": 2, "failures": 2, "backoffInitial": 0,
                                         "backoffMax": 1, "maxRestarts": 2, "window": 600, "loadTimeout": 10},
                            "ray": {"ctl": "", "pidFile": "p", "envFile": "e", "argvFile": "a", "log": "l"}})
    follower = keeper.Follower({**common, "role": "follower", "node": "n2", "stateDir": str(follow_dir),
                                "containers": ["rank1"], "leader": f"127.0.0.1:{port}"})
    leader.docker = follower.docker = docker
    for k in (leader, follower):
        threading.Thread(target=k.run, daemon=True).start()
    g = type("Group", (), dict(leader=leader, docker=docker, api=api, events=events, dir=lead_dir))
    keeper.arm(str(lead_dir), "token-1", 30)
    wait(lambda: leader.state.get("lastProbe"))
    return g


def wait(ready, timeout=30):
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_armed_it_probes_with_the_api_key_and_adopts_what_up_made(group):
    assert group.leader.state["armed"] and group.leader.state["lastProbe"]["error"] is None
    assert group.api.keys[-1] == "Bearer k"
    assert group.events == []  # nothing stopped or started


def test_a_dead_rank_relaunches_every_rank_all_stopped_before_any_starts(group):
    group.docker.up["rank1"] = False  # the follower's rank dies
    wait(lambda: len(group.leader.state["restarts"]) == 1 and group.leader.state["phase"] == "watching")
    assert "rank1 on n2 is not running" in group.leader.state["restarts"][0]["reason"]
    stops = [i for i, (op, _) in enumerate(group.events) if op == "stop"]
    starts = [i for i, (op, _) in enumerate(group.events) if op == "start"]
    assert {n for op, n in group.events if op == "start"} == {"rank0", "rank1"}
    assert stops and max(stops) < min(starts), group.events
    assert group.docker.up == {"rank0": True, "rank1": True}
    lines = (group.dir / "watchdog.log").read_text().splitlines()
    assert "relaunch 1 of 2" in lines[0] and "serving again after" in lines[1]
    assert (group.dir / "serve.log").read_text() == "the log of rank0\n"  # kept before rank 0 started again


def test_failed_probes_in_a_row_relaunch(group):
    group.api.mode = "hang"
    wait(lambda: group.leader.state["restarts"])
    group.api.mode = "ok"
    assert "2 probes failed in a row" in group.leader.state["restarts"][0]["reason"]
    wait(lambda: group.leader.state["phase"] == "watching")


def test_a_crash_loop_gives_up_and_stays_down(group):
    group.docker.crash.add("rank0")
    group.docker.up["rank0"] = False
    wait(lambda: group.leader.state.get("gave_up"))
    assert group.leader.state["gave_up"].startswith("gave up after 2 restarts: rank0 on n1 is not running")
    assert group.docker.up == {"rank0": False, "rank1": False}
    starts = len([e for e in group.events if e[0] == "start"])
    time.sleep(3)
    assert len([e for e in group.events if e[0] == "start"]) == starts  # no third relaunch
    # Armed again (a new deployment), it relaunches what it stopped.
    group.docker.crash.clear()
    keeper.arm(str(group.dir), "token-2", 30)
    wait(lambda: not group.leader.state.get("gave_up") and group.docker.up == {"rank0": True, "rank1": True})


def test_disarmed_it_starts_and_counts_nothing(group):
    keeper.disarm(str(group.dir), 10)
    group.docker.up["rank1"] = False
    time.sleep(3)
    assert group.leader.state["restarts"] == [] and group.events == []


@pytest.mark.parametrize("group", ["ray"], indirect=True)
def test_ray_a_dead_serve_is_relaunched_alone_on_the_intact_cluster(group):
    group.docker.serve = False
    wait(lambda: len(group.leader.state["restarts"]) == 1 and group.leader.state["phase"] == "watching")
    assert group.events == [("start", "serve")]  # no container stopped, no generation raised
    assert not group.leader.state["restarts"][0]["whole"] and group.leader.state["gen"] == 1


@pytest.mark.parametrize("group", ["ray"], indirect=True)
def test_ray_a_dead_worker_restarts_every_container_then_the_serve(group):
    group.docker.up["rank1"] = False
    wait(lambda: len(group.leader.state["restarts"]) == 1 and group.leader.state["phase"] == "watching")
    assert group.events[0] == ("stop", "serve") and group.events[-1] == ("start", "serve"), group.events
    assert ("start", "rank0") in group.events and ("start", "rank1") in group.events
    assert group.leader.state["restarts"][0]["whole"] and group.leader.state["gen"] == 2


def test_a_report_sampled_before_a_stop_does_not_confirm_it(tmp_path):
    """The leader stops the group just after the follower sampled its containers (rank1 down between two starts):
    that report reaches the leader after the stop, but only the next one, sampled once the follower acted on the
    stop, may confirm it."""
    port = free_port()
    (tmp_path / "n1").mkdir()
    (tmp_path / "n2").mkdir()
    leader = keeper.Leader({"stack": "t", "executor": "mp", "role": "leader", "node": "n1",
                            "stateDir": str(tmp_path / "n1"), "containers": ["rank0"], "bind": "127.0.0.1",
                            "port": port, "followers": ["n2"], "watchdog": {}})
    follower = keeper.Follower({"stack": "t", "executor": "mp", "role": "follower", "node": "n2",
                                "stateDir": str(tmp_path / "n2"), "containers": ["rank1"],
                                "leader": f"127.0.0.1:{port}"})
    leader.serve_followers()
    leader.save(armed=True, gen=1, run=True)
    docker = FakeDocker([], ["rank0", "rank1"])
    follower.docker = docker
    mine = follower.tick({"gen": 1})
    assert leader.stopped(leader.reports["n2"][1]) is False  # running, told to run

    sampled = docker.running

    def sample_then_stop(name):
        docker.running = sampled
        running = sampled(name)
        leader.save(gen=2, run=False)  # the stop, as Leader.stop_group makes it, right after this sample
        return running

    docker.up["rank1"] = False
    docker.running = sample_then_stop
    mine = follower.tick(mine)
    assert leader.reports["n2"][1]["running"] == {"rank1": False}
    assert leader.stopped(leader.reports["n2"][1]) is False
    follower.tick(mine)
    assert leader.stopped(leader.reports["n2"][1]) is True
