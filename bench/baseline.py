"""The baseline: bench/seed.sh (the seed's script) timed to a serving endpoint, and what its `sleep 5` missed."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import probes
import timing

SEED = Path(__file__).with_name("seed.sh")
HEAD, WORKER = (1, "seed-ray-head"), (2, "seed-ray-worker")
LOG = "/root/vllm-serve.log"
SLEEP_S = 5  # the seed's `sleep 5` (seed.sh's default for SEED_SLEEP)
WORKER_IP = "10.87.200.12"


@dataclass
class SeedRun:
    script_s: float  # until the script returned
    ready_s: float  # until /v1/models listed the model: the script, then the wait the seed did not have
    restarted: int  # containers that ran before and were gone after
    early: bool  # serve asked Ray for placement before the worker had joined: `sleep 5` was too short
    worker_late_s: float  # worker registered in Ray minus serve launched (serve needs ~1 s more to ask Ray)
    ray_join_s: float  # worker container started -> its raylet registered with the head
    load_s: float | None  # the stand-in's "Loading weights took" figure
    sleep_s: float  # the script's sleep before serve: 5, unless earlier runs never served


class SeedFailed(RuntimeError):
    """The seed's serve exited without serving: what its missing readiness wait allows (Ray not up yet)."""


def run(max_model_len: int, sleep_s: float = SLEEP_S) -> SeedRun:
    before = probes.containers([1, 2])
    start = time.monotonic()
    t0 = time.time()
    done = timing.run([str(SEED)], SEED.parent, {**os.environ, "MAX_MODEL_LEN": str(max_model_len),
                                                     "SEED_SLEEP": f"{sleep_s:g}"})
    if done.returncode != 0:
        raise RuntimeError(f"seed.sh failed ({done.returncode}):\n{done.output}")
    try:
        ready = probes.wait_models(max_model_len, start, alive=_serving)
    except (TimeoutError, probes.Stopped) as e:
        tail = "\n".join(probes.serve_log(*HEAD, LOG).splitlines()[-40:])
        ray = probes.node_sh(HEAD[0], f"docker logs --tail 20 {HEAD[1]} 2>&1; docker ps -a", check=False)
        raise SeedFailed(f"{e}\nthe seed's serve log ({LOG}), its last lines:\n{tail}\n"
                         f"the Ray head's log and node1's containers:\n{ray}") from None
    serve_launch = t0 + next(t for t, line in done.lines if line == "start serve")
    log = probes.serve_log(*HEAD, LOG)
    joined = probes.ray_node_starts(*HEAD)[WORKER_IP]
    return SeedRun(script_s=done.seconds, ready_s=ready, restarted=probes.restarted(before, probes.containers([1, 2])),
                   early=_started_early(log), worker_late_s=joined - serve_launch,
                   ray_join_s=joined - probes.started_at(*WORKER), load_s=probes.load_seconds(log),
                   sleep_s=sleep_s)


def _serving() -> bool:
    """Whether the seed's `vllm serve` still runs in its head container (the container gone counts as no)."""
    return probes.node_sh(HEAD[0], f"docker exec {HEAD[1]} pgrep -f 'vllm serve' >/dev/null 2>&1 && echo yes",
                          check=False).strip() == "yes"


def _started_early(log: str) -> bool:
    """The double logs the Ray nodes it saw when placing its workers, and warns or waits when GPUs are short."""
    seen = re.search(r"Ray node IPs: \[([^\]]*)\]", log)
    return probes.started_early(log) or seen is None or WORKER_IP not in seen.group(1)


def teardown() -> None:
    """What the seed's own stop step does, outside the timed runs."""
    for node, name in (HEAD, WORKER):
        probes.node_sh(node, f"docker rm -f {name} >/dev/null 2>&1 || true")
