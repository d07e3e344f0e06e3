"""Day two: what preflight's probe finds running -> each piece's life token and why it is recreated.

The facts are as components/remote/preflight_probe.py prints them; tests/e2e/test_day_two.py runs the probe for
real on the lab, after reboots, removals, a crash loop and a wedge.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.preflight import liveness
from components.config import loader
from components import preflight
from components.nodes.node_facts import parse
from components.preflight.judging import Status, evaluate
from fixtures import models_with, stack_config, write_catalog
from harness import ROOT, run_program
from test_preflight_checks import healthy, load_probe

NEW = "20261204T120000Z"
HEAD, WORKERS = "spark-vllm-test-ray-head", "spark-vllm-test-ray-worker"
RANK = "spark-vllm-test-vllm-rank{}"
KEEPER = "spark-vllm-test-keeper"
NODES = ("spark1", "spark2", "spark3")


def deployment(tmp_path, executor="ray", watchdog=False):
    cfg = stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True},
                       serve={"executor": executor}, watchdog={"enabled": watchdog})
    return loader.load("test", cfg, set(), ROOT)


def up(life="L1", **more) -> dict:
    return {"running": True, "status": "running", "exitCode": 0, "life": life, **more}


def ray_running() -> dict:
    """The probe's `running` group of every node of a healthy Ray deployment, deployed with life L1."""
    return {"spark1": {"containers": {HEAD: up()}, "serve": {"running": True, "life": "S1"},
                       "api": {"answered": 0.04}},
            "spark2": {"containers": {WORKERS: up()}}, "spark3": {"containers": {WORKERS: up()}}}


def mp_running() -> dict:
    return {"spark1": {"containers": {RANK.format(0): up()}, "api": {"answered": 0.04}},
            "spark2": {"containers": {RANK.format(1): up()}}, "spark3": {"containers": {RANK.format(2): up()}}}


def judged(d, running: dict) -> liveness.Lives:
    return liveness.judge(d, {name: parse({"running": value}) for name, value in running.items()}, NEW)


def test_nothing_is_known_without_facts(tmp_path):
    lives = liveness.judge(deployment(tmp_path), {}, NEW)
    assert lives.engine("spark1") is None and lives.serve == liveness.Life() and not any(lives.dead.values())


def test_a_healthy_deployment_keeps_every_token(tmp_path):
    lives = judged(deployment(tmp_path), ray_running())
    assert [lives.engine(n) for n in NODES] == ["L1", "L1", "L1"]
    assert lives.serve == liveness.Life("S1")
    assert not any(lives.dead.values())
    assert lives.alive["spark1"] == (f"{HEAD} running", "vllm serve running, answered a completion in 0.04 s")


def test_a_first_up_gives_new_tokens_and_calls_nothing_dead(tmp_path):
    lives = judged(deployment(tmp_path), {n: {"containers": {}} for n in NODES})
    assert [lives.engine(n) for n in NODES] == [NEW] * 3 and lives.serve.token == NEW
    assert not any(lives.dead.values())
    assert lives.alive["spark2"] == (f"{WORKERS} is not on spark2: up creates it",)


def test_containers_deployed_before_tokens_keep_none(tmp_path):
    running = ray_running()
    for node in running.values():
        for c in node["containers"].values():
            c["life"] = None
    running["spark1"]["serve"]["life"] = None
    lives = judged(deployment(tmp_path), running)
    assert [lives.engine(n) for n in NODES] == [None] * 3 and lives.serve.token is None


def test_an_exited_head_is_recreated_with_what_depends_on_it(tmp_path):
    running = ray_running()
    running["spark1"] = {"containers": {HEAD: up(running=False, status="exited", exitCode=255, finishedAgo=250)}}
    lives = judged(deployment(tmp_path), running)
    # Its workers too: a new head is a new cluster, and nothing else ties them to it (they start beside it).
    assert [lives.engine(n) for n in NODES] == [NEW, NEW, NEW]
    assert lives.serve == liveness.Life(NEW)  # with its container, which says why
    assert lives.dead["spark1"] == (f"{HEAD} exited 4 min ago (code 255): it and what depends on it will be "
                                    "recreated",)
    assert lives.dead["spark2"] == () and lives.alive["spark2"] == (f"{WORKERS} running",)


def test_a_worker_removed_by_hand_is_recreated_alone(tmp_path):
    running = ray_running()
    running["spark3"] = {"containers": {}}
    lives = judged(deployment(tmp_path), running)
    assert [lives.engine(n) for n in NODES] == ["L1", "L1", NEW]
    assert lives.serve == liveness.Life("S1")  # its triggers follow the cluster gate, which follows the worker
    assert lives.dead["spark3"] == (f"{WORKERS} is not on spark3: it, the cluster gate and the serve will be "
                                    "recreated",)


def test_a_dead_serve_restarts_alone_naming_the_watchdog_that_gave_up(tmp_path):
    running = ray_running()
    running["spark1"].update(serve={"running": False}, keeper={"gave_up": "gave up after 2 restarts: boom"})
    del running["spark1"]["api"]
    lives = judged(deployment(tmp_path), running)
    assert [lives.engine(n) for n in NODES] == ["L1", "L1", "L1"]
    assert lives.serve.token == NEW
    assert lives.dead["spark1"] == ("vllm serve is not running (the watchdog gave up after 2 restarts: boom): the "
                                    "serve will be restarted",)


@pytest.mark.parametrize("api, dead", [
    ({"timeout": 20}, "vllm serve runs, but the API gives no completion within 20 s (a wedged engine)"),
    ({"failed": "HTTP 500 Internal Server Error", "status": 500},
     "vllm serve runs, but the API fails a completion: HTTP 500 Internal Server Error"),
    ({"failed": "ConnectionResetError: [Errno 104] Connection reset by peer"},
     "vllm serve runs, but the API fails a completion: ConnectionResetError: [Errno 104] Connection reset by peer"),
])
def test_a_wedged_serve_restarts(tmp_path, api, dead):
    running = ray_running()
    running["spark1"]["api"] = api
    lives = judged(deployment(tmp_path), running)
    assert lives.serve == liveness.Life(NEW, dead)
    assert lives.dead["spark1"] == (f"{dead}: the serve will be restarted",)


@pytest.mark.parametrize("api, said", [
    ({"refused": True}, "vllm serve running, not answering yet (loading)"),
    ({"failed": "HTTP 401 Unauthorized", "status": 401}, "vllm serve running, answered a completion with HTTP 401 "
                                                         "Unauthorized"),
])
def test_a_loading_serve_or_a_client_error_is_not_dead(tmp_path, api, said):
    """Restarting a serve that loads would start its load again: an `up` after a gate's timeout must wait."""
    running = ray_running()
    running["spark1"]["api"] = api
    lives = judged(deployment(tmp_path), running)
    assert lives.serve == liveness.Life("S1") and not any(lives.dead.values())
    assert said in lives.alive["spark1"]


def test_mp_one_dead_rank_recreates_every_rank(tmp_path):
    running = mp_running()
    running["spark2"] = {"containers": {RANK.format(1): up(running=False, status="exited", exitCode=137,
                                                            finishedAgo=30)}}
    del running["spark1"]["api"]
    lives = judged(deployment(tmp_path, "mp"), running)
    assert [lives.engine(n) for n in NODES] == [NEW] * 3
    assert lives.dead["spark2"] == (f"{RANK.format(1)} exited 30 s ago (code 137): every rank will be recreated (a "
                                    "torch.distributed group cannot take one back)",)
    assert lives.dead["spark1"] == ()


def test_mp_a_healthy_group_keeps_its_token_and_a_wedged_one_restarts(tmp_path):
    d = deployment(tmp_path, "mp")
    assert [judged(d, mp_running()).engine(n) for n in NODES] == ["L1"] * 3
    running = mp_running()
    running["spark1"]["api"] = {"timeout": 20}
    lives = judged(d, running)
    assert [lives.engine(n) for n in NODES] == [NEW] * 3
    assert lives.dead["spark1"] == ("rank 0 runs, but the API gives no completion within 20 s (a wedged engine): "
                                    "every rank will be recreated (a torch.distributed group cannot take one back)",)


def test_mp_ranks_of_different_lives_are_no_group(tmp_path):
    running = mp_running()
    running["spark3"]["containers"][RANK.format(2)]["life"] = "L2"
    assert [judged(deployment(tmp_path, "mp"), running).engine(n) for n in NODES] == [NEW] * 3


def with_keepers(running: dict, **state) -> dict:
    running = copy.deepcopy(running)
    for node in running.values():
        node["containers"][KEEPER] = up("K1")
    running["spark1"]["keeper"] = {"armed": True, "token": "0123456789abcdef.A1", "phase": "watching", **state}
    return running


def test_an_armed_watchdog_keeps_its_tokens(tmp_path):
    lives = judged(deployment(tmp_path, watchdog=True), with_keepers(ray_running()))
    assert {n: life.token for n, life in lives.keepers.items()} == {n: "K1" for n in NODES}
    assert lives.arm == liveness.Life("A1") and not any(lives.dead.values())


def test_a_disarmed_watchdog_is_armed_again(tmp_path):
    lives = judged(deployment(tmp_path, watchdog=True), with_keepers(ray_running(), armed=False, phase="disarmed"))
    assert lives.arm == liveness.Life(NEW, "the watchdog is not armed (disarmed)")
    assert lives.dead["spark1"] == ("the watchdog is not armed (disarmed): up arms it again",)


def test_a_watchdog_that_gave_up_is_armed_again_with_what_it_stopped(tmp_path):
    running = with_keepers(mp_running(), gave_up="gave up after 3 restarts: rank 1 died")
    for n, rank in enumerate(NODES):
        running[rank]["containers"][RANK.format(n)].update(running=False, status="exited", exitCode=137)
    del running["spark1"]["api"]
    lives = judged(deployment(tmp_path, "mp", watchdog=True), running)
    assert lives.arm == liveness.Life(NEW, "the watchdog gave up after 3 restarts: rank 1 died")
    assert lives.serve.dead.endswith("(the watchdog gave up after 3 restarts: rank 1 died)")


def test_a_removed_keeper_is_recreated(tmp_path):
    running = with_keepers(ray_running())
    del running["spark2"]["containers"][KEEPER]
    lives = judged(deployment(tmp_path, watchdog=True), running)
    assert lives.keepers["spark2"] == liveness.Life(NEW, f"{KEEPER} is not on spark2")
    assert lives.dead["spark2"] == (f"{KEEPER} is not on spark2: the keeper will be recreated",)


# ---- the preflight row, and the program ----

def node_facts(running: dict) -> dict:
    facts = healthy()
    for name, value in running.items():
        facts[name]["running"] = value
    return facts


def test_the_running_row_warns_with_the_cause_and_fails_when_unknown(tmp_path):
    d = deployment(tmp_path)
    running = ray_running()
    running["spark1"] = {"containers": {HEAD: up(running=False, status="exited", exitCode=255, finishedAgo=250)}}
    running["spark3"] = {"unavailable": "`docker inspect` failed: permission denied"}
    facts = {name: parse(raw) for name, raw in node_facts(running).items()}
    rows = {(f.node, f.check): f for f in evaluate(d, facts, liveness.judge(d, facts, NEW))}
    head, spark2, spark3 = rows["spark1", "running"], rows["spark2", "running"], rows["spark3", "running"]
    assert head.status is Status.WARN and head.reason.startswith(f"{HEAD} exited 4 min ago (code 255)")
    assert head.fix == "`pulumi up` recreates what died, and what depends on it"
    assert spark2.status is Status.OK and spark2.reason == f"{WORKERS} running"
    assert spark3.status is Status.FAIL
    assert spark3.reason == "could not read what runs: `docker inspect` failed: permission denied"


def test_the_program_gives_each_piece_its_token(tmp_path, monkeypatch):
    running = ray_running()
    running["spark2"] = {"containers": {WORKERS: up(running=False, status="exited", exitCode=255)}}
    facts = node_facts(running)
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    monkeypatch.setattr(liveness.time, "strftime", lambda *_: NEW)
    recording = run_program(stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True},
                                         watchdog={"enabled": False}))

    def life(name):
        labels = recording.by_name(name).inputs["labels"]
        return [label["value"] for label in labels if label["label"] == "spark-vllm.life"]
    assert life("ray-head-container") == ["L1"] and life("ray-worker-spark2-container") == [NEW]
    assert life("ray-worker-spark3-container") == ["L1"]
    serve = recording.by_name("vllm-serve-process").inputs
    assert "S1" in serve["triggers"] and "--life=S1" in serve["create"]


# ---- the probe's one completion, against a stand-in API on loopback ----

class StandInApi(BaseHTTPRequestHandler):
    """Answers /v1/completions as the test says: 200, a status, or not before the client gave up."""
    answer: tuple[int, float] = (200, 0.0)
    seen: list[dict] = []

    def do_POST(self):
        status, delay = self.answer
        body = self.rfile.read(int(self.headers["Content-Length"]))
        StandInApi.seen.append({"auth": self.headers.get("Authorization"), "body": json.loads(body)})
        time.sleep(delay)
        data = json.dumps({"choices": [{"text": "pong"}]}).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first: the timeout case

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    StandInApi.seen = []
    yield {"host": "127.0.0.1", "port": server.server_address[1], "model": "m", "timeout": 1}
    server.shutdown()


@pytest.mark.parametrize("answer, found", [
    ((200, 0.0), "answered"), ((500, 0.0), {"failed": "HTTP 500 Internal Server Error", "status": 500}),
    ((401, 0.0), {"failed": "HTTP 401 Unauthorized", "status": 401}), ((200, 2.0), {"timeout": 1})])
def test_the_probe_asks_one_completion_with_the_key_and_says_how_it_went(api, answer, found):
    StandInApi.answer = answer
    got = load_probe()._completion(api, "k'ey")
    assert (list(got) == ["answered"]) if found == "answered" else got == found
    assert StandInApi.seen[0] == {"auth": "Bearer k'ey", "body": {"model": "m", "prompt": "ping", "max_tokens": 1}}


def test_the_probe_takes_a_refused_connection_for_a_load_not_a_death():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    assert load_probe()._completion({"host": "127.0.0.1", "port": port, "model": "m", "timeout": 1}, None) == \
        {"refused": True}


def test_the_probe_reads_dockers_times_by_the_nodes_clock():
    probe = load_probe()
    then = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 125)) + ".123456789Z"
    assert 124 <= probe._ago(then) <= 127
    assert probe._ago("0001-01-01T00:00:00Z") is None


def test_a_dead_rank_group_takes_each_nodes_load_turn_again(tmp_path, monkeypatch):
    """mp: a dead rank's new group is a new load, so each node's turn is taken again (docs/placement.md)."""
    running = mp_running()
    running["spark2"] = {"containers": {RANK.format(1): up(running=False, status="exited", exitCode=137)}}
    facts = node_facts(running)
    facts["spark1"]["ports"] = {"29501": {"free": True}, "8000": {"free": True}}  # what mp's head opens
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    monkeypatch.setattr(liveness.time, "strftime", lambda *_: NEW)
    recording = run_program(stack_config(write_catalog(tmp_path / "catalog", models=models_with(
        lambda m: m["big"].update(executor="mp"))), preflight={"enabled": True}, watchdog={"enabled": False}))
    for node in NODES:
        assert NEW in recording.by_name(f"mp-serve-load-turn-{node}").inputs["triggers"]
