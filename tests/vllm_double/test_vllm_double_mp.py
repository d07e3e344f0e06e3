"""`--distributed-executor-backend mp --nnodes N`: N `vllm serve` processes meet at the master's address.

Each rank runs as its own process on its own loopback address (127.0.0.2, .3, .4), as Sparks do on their fabric
addresses; the master port is a real listening TCP port, and nothing else fakes the meeting.
"""

import re
import socket
import subprocess
import time

import pytest
from vllm_double_support import free_port, http

MASTER = "127.0.0.2"


def rank_args(model, nnodes: int, rank: int, port: int, tp: int = None, pp: int = 1, addr: str = MASTER):
    args = [str(model), "--served-model-name", "lab-tiny", "--distributed-executor-backend", "mp",
            "--tensor-parallel-size", str(tp or nnodes), "--pipeline-parallel-size", str(pp),
            "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", addr, "--master-port", str(port)]
    return args + (["--headless"] if rank else [])


def start_ranks(start_double, model, nnodes: int, port: int, **env):
    """Rank 0 on 127.0.0.2 and rank k on 127.0.0.(2+k), each with its own VLLM_HOST_IP."""
    return [start_double(rank_args(model, nnodes, rank, port), VLLM_HOST_IP=f"127.0.0.{2 + rank}", **env)
            for rank in range(nnodes)]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((MASTER, port)) == 0


def test_two_ranks_meet_load_their_shares_and_serve(start_double, tiny_model):
    port = free_port()
    head, worker = start_ranks(start_double, tiny_model, 2, port, VLLM_DOUBLE_SHARD_DELAY_S="0.2")
    head.wait_ready(timeout=60)
    assert http(head.url + "/v1/models")[1]["data"][0]["id"] == "lab-tiny"
    status, body = http(head.url + "/v1/chat/completions", "POST",
                        {"messages": [{"role": "user", "content": "hello ranks"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "[lab-tiny] hello ranks"
    # Each rank read half of the 4 shards: the progress lines count 2, not 4.
    for double in (head, worker):
        assert re.findall(r"Completed \| (\d+)/(\d+)", double.log())[-1] == ("2", "2"), double.log()
    assert "rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, TP rank 0" in head.log()
    assert "rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, TP rank 1" in worker.log()
    # The headless rank serves nothing on its own address.
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.3", worker.port)) != 0
    assert listening(port)


def test_the_api_waits_for_the_last_rank(start_double, tiny_model):
    port = free_port()
    head = start_double(rank_args(tiny_model, 2, 0, port), VLLM_HOST_IP=MASTER)
    time.sleep(3)
    assert head.proc.poll() is None
    with pytest.raises(OSError):
        http(head.url + "/health", timeout=2)
    start_double(rank_args(tiny_model, 2, 1, port), VLLM_HOST_IP="127.0.0.3")
    head.wait_ready(timeout=60)


def test_three_ranks_with_pipeline_parallel(start_double, tiny_model):
    port = free_port()
    ranks = [start_double(rank_args(tiny_model, 3, r, port, tp=1, pp=3), VLLM_HOST_IP=f"127.0.0.{2 + r}")
             for r in range(3)]
    ranks[0].wait_ready(timeout=60)
    assert "rank 2 in world size 3 is assigned as DP rank 0, PP rank 2, TP rank 0" in ranks[2].log()


def test_a_worker_that_dies_takes_the_head_down(start_double, tiny_model):
    port = free_port()
    head, worker = start_ranks(start_double, tiny_model, 2, port)
    head.wait_ready(timeout=60)
    worker.proc.kill()
    assert head.wait_exit(timeout=20) == 1
    assert "Node rank 1 (127.0.0.3) of the engine died" in head.log()


def test_a_head_that_dies_takes_the_workers_down(start_double, tiny_model):
    port = free_port()
    head, worker = start_ranks(start_double, tiny_model, 2, port)
    head.wait_ready(timeout=60)
    head.proc.kill()
    assert worker.wait_exit(timeout=20) == 1
    assert f"Lost the master (node rank 0 at {MASTER}:{port})" in worker.log()


def test_a_stopped_head_ends_the_workers_cleanly(start_double, tiny_model):
    port = free_port()
    head, worker = start_ranks(start_double, tiny_model, 2, port)
    head.wait_ready(timeout=60)
    assert head.stop() == 0
    assert worker.wait_exit(timeout=20) == 0


def test_a_rank_that_cannot_reach_the_master_times_out_naming_it(run_double, tiny_model):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = run_double(["serve", *rank_args(tiny_model, 2, 1, port), "--port", "0"],
                        VLLM_HOST_IP="127.0.0.3", VLLM_DOUBLE_RENDEZVOUS_TIMEOUT_S="3")
    assert result.returncode == 1
    assert 3 <= time.monotonic() - started < 30
    assert (f"DistNetworkError: The client socket has timed out after 3000ms while trying to connect to "
            f"({MASTER}, {port})") in result.stdout


def test_the_head_alone_times_out_naming_the_missing_ranks(run_double, tiny_model):
    port = free_port()
    result = run_double(["serve", *rank_args(tiny_model, 2, 0, port), "--port", str(free_port())],
                        VLLM_HOST_IP=MASTER, VLLM_DOUBLE_RENDEZVOUS_TIMEOUT_S="3")
    assert result.returncode == 1
    assert f"waiting for 2 node ranks at {MASTER}:{port}: joined node ranks [0], missing [1]" in result.stdout


def test_vllm_host_ip_not_on_this_node_fails_at_once(run_double, tiny_model):
    result = run_double(["serve", *rank_args(tiny_model, 2, 1, free_port()), "--port", "0"],
                        VLLM_HOST_IP="192.0.2.7", VLLM_DOUBLE_RENDEZVOUS_TIMEOUT_S="30", timeout=20)
    assert result.returncode == 1
    assert "VLLM_HOST_IP 192.0.2.7 is not an address of this node: cannot bind 192.0.2.7" in result.stdout


@pytest.mark.parametrize("flag,head_value,worker_value", [
    ("--tensor-parallel-size", "2", "1"), ("--pipeline-parallel-size", "1", "2")])
def test_ranks_that_disagree_both_fail(start_double, tiny_model, flag, head_value, worker_value):
    port = free_port()
    head_args, worker_args = rank_args(tiny_model, 2, 0, port, tp=1, pp=1), rank_args(tiny_model, 2, 1, port, tp=1)
    # Both worlds must split over 2 nodes: 2x1 against 1x2.
    head_args[head_args.index("--tensor-parallel-size") + 1] = "2"
    worker_args[worker_args.index("--pipeline-parallel-size") + 1] = "2"
    head = start_double(head_args, VLLM_HOST_IP=MASTER)
    worker = start_double(worker_args, VLLM_HOST_IP="127.0.0.3")
    assert head.wait_exit(timeout=30) == 1 and worker.wait_exit(timeout=30) == 1
    for double in (head, worker):
        assert "The node ranks disagree on the parallel configuration: node rank 0 (127.0.0.2) has " \
               "tensor_parallel_size=2, pipeline_parallel_size=1, nnodes=2; node rank 1 (127.0.0.3) has " \
               "tensor_parallel_size=1, pipeline_parallel_size=2, nnodes=2." in double.log()


def test_ranks_that_disagree_on_nnodes_fail(start_double, tiny_model):
    port = free_port()
    head = start_double(rank_args(tiny_model, 2, 0, port, tp=2), VLLM_HOST_IP=MASTER,
                        VLLM_DOUBLE_RENDEZVOUS_TIMEOUT_S="10")
    worker = start_double(rank_args(tiny_model, 3, 1, port, tp=3)[:] , VLLM_HOST_IP="127.0.0.3")
    assert head.wait_exit(timeout=30) == 1
    assert "nnodes=3" in head.log() and "disagree" in head.log()
    assert worker.wait_exit(timeout=30) == 1


def test_a_taken_master_port_fails_like_torch(run_double, tiny_model):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_double(["serve", *rank_args(tiny_model, 2, 0, port), "--port", str(free_port())],
                            VLLM_HOST_IP=MASTER)
    assert result.returncode == 1
    assert (f"The server socket has failed to listen on any local network address. port: {port}, useIpv6: false, "
            "code: -98, name: EADDRINUSE") in result.stdout


def test_a_rank_without_the_weights_fails_and_the_head_says_so(start_double, tiny_model, tmp_path):
    port = free_port()
    head = start_double(rank_args(tiny_model, 2, 0, port), VLLM_HOST_IP=MASTER)
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    (empty / "config.json").write_text((tiny_model / "config.json").read_text())
    worker = start_double(rank_args(empty, 2, 1, port), VLLM_HOST_IP="127.0.0.3")
    assert worker.wait_exit(timeout=30) == 1
    assert "Cannot find any model weights" in worker.log()
    assert head.wait_exit(timeout=30) == 1
    assert "Node rank 1 (127.0.0.3) failed to load the checkpoint" in head.log() or \
        "did not finish loading" in head.log()


@pytest.mark.parametrize("argv,message", [
    (["--nnodes", "2", "--node-rank", "1", "--distributed-executor-backend", "mp", "-tp", "2"],
     "Node rank 1 serves no API: run it with --headless."),
    (["--nnodes", "2", "--distributed-executor-backend", "ray", "-tp", "2"],
     "--nnodes 2 needs --distributed-executor-backend mp (got ray)."),
    (["--nnodes", "2", "--distributed-executor-backend", "mp", "-tp", "3"],
     "The world size 3 (tensor_parallel_size 3 x pipeline_parallel_size 1) is not divisible by nnodes 2."),
    (["--headless"], "--headless runs a node rank above 0 of a multi-node engine: it needs --nnodes > 1."),
])
def test_flag_combinations_vllm_refuses(run_double, tiny_model, argv, message):
    result = run_double(["serve", str(tiny_model), "--port", "0", *argv])
    assert result.returncode == 1
    assert message in result.stdout


def test_node_rank_out_of_range_is_an_argparse_error(run_double, tiny_model):
    result = run_double(["serve", str(tiny_model), "--nnodes", "2", "--node-rank", "2"])
    assert result.returncode == 2
    assert "--node-rank 2 must be from 0 to --nnodes - 1 (1)" in result.stdout


def test_ss_shows_what_the_ranks_listen_on(start_double, tiny_model):
    """The ports a guard must cover: the master port on rank 0, one random port a rank on its own address."""
    port = free_port()
    head, worker = start_ranks(start_double, tiny_model, 2, port)
    head.wait_ready(timeout=60)
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    mine = {pid: [] for pid in (head.proc.pid, worker.proc.pid)}
    for line in ss.splitlines():
        for pid in mine:
            if f"pid={pid}," in line:
                mine[pid].append(line.split()[3])
    own = [a for a in mine[head.proc.pid] if a.startswith("127.0.0.2:")]
    assert len(own) == 1
    assert sorted(set(mine[head.proc.pid]) - set(own)) == sorted([f"0.0.0.0:{port}", f"127.0.0.1:{head.port}"])
    assert len(mine[worker.proc.pid]) == 1 and mine[worker.proc.pid][0].startswith("127.0.0.3:")
