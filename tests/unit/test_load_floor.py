"""The floor of a load and the `load` output: what the last load took against the weights over the disk's speed."""

from components.nodes import load_floor
from components.nodes.node_facts import Disk, Model, NodeFacts

GIB = 1 << 30


def node(weights_gib: int, disk: Disk) -> NodeFacts:
    files = (("config.json", 900), *((f"model-{k}.safetensors", GIB) for k in range(weights_gib)))
    return NodeFacts(model=Model(exists=True, files=files), disk=disk)


def test_the_floor_is_the_slowest_nodes_weights_over_its_disk():
    facts = {"spark1": node(8, Disk(file="model-0.safetensors", bytes=GIB, seconds=0.5)),   # 8 GiB at 2 GiB/s: 4 s
             "spark2": node(8, Disk(file="model-0.safetensors", bytes=GIB, seconds=1.0))}   # 8 GiB at 1 GiB/s: 8 s
    assert load_floor.floor(facts) == 8.0


def test_no_floor_unless_every_node_was_measured():
    facts = {"spark1": node(8, Disk(file="model-0.safetensors", bytes=GIB, seconds=0.5)),
             "spark2": node(8, Disk(unavailable="no O_DIRECT"))}
    assert load_floor.floor(facts) is None
    assert load_floor.floor({}) is None


def test_the_report_reads_vllms_line_from_the_gate_against_the_floor():
    out = ("waiting up to 60 min for vllm serve (rank 0) on node1\nloading weights 39/39 shards (9 min elapsed)\n"
           "vllm: INFO 12-05 10:00:00 Loading weights took 549.60 seconds\nready: qwen served at http://x/v1\n")
    assert load_floor.report(out, 122 * 10**9, 61.0) == {"seconds": 549.6, "gbPerSecond": 0.222,
                                                         "floorSeconds": 61.0, "ratioToFloor": 9.0}
    assert load_floor.text(load_floor.report(out, 122 * 10**9, 61.0)) == (
        "549.6 s, 0.22 GB/s: 9x its floor of 61 s (the slowest node's weights over its disk's read speed)")


def test_without_a_floor_or_a_load_the_report_says_what_it_knows():
    out = "vllm: Loading weights took 7.06 seconds\n"
    assert load_floor.report(out, None, None) == {"seconds": 7.06}
    assert load_floor.text({"seconds": 7.06}) == (
        "7.1 s; its floor was not measured (preflight's disk row says why)")
    assert load_floor.report("ready: lab-tiny served\n", 10, 1.0) == {}
