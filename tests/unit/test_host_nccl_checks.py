"""nccl.hostLibrary (docs/host-nccl.md): the probe's reading of both NCCL libraries, the config's rule, preflight's
finding, and the read-only mount over the image's pip library that the engine containers get."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from components import preflight
from components.config import loader
from components.config.schema import ConfigError
from components.nodes.node_facts import parse
from fixtures import stack_config, write_catalog
from harness import ROOT, run_program
from test_preflight_checks import healthy, load_probe, one

CONTAINER = "docker:index/container:Container"
PIP = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
HOST = "/usr/lib/aarch64-linux-gnu/libnccl.so.2"
# vllm 41725's two libraries: one version, two builds (the first 8 hex digits are the reporter's).
PIP_NCCL = {"path": PIP, "real": PIP, "version": "2.28.9", "buildId": "a7f420a1" + "0" * 32, "size": 219 << 20}
HOST_NCCL = {"path": HOST, "real": HOST + ".28.9", "version": "2.28.9", "buildId": "c0db9360" + "1" * 32,
             "size": 190 << 20}


def elf_libraries() -> list[str]:
    """Shared libraries of this machine's own C library and zlib, resolved: real 64-bit ELF files with build IDs."""
    found = []
    for line in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout.splitlines():
        if re.match(r"\s*(libz\.so\.1|libc\.so\.6) \(.*x86-64|\s*(libz\.so\.1|libc\.so\.6) \(.*AArch64", line):
            found.append(os.path.realpath(line.split(" => ")[1].strip()))
    return sorted(set(found))


def readelf_build_id(path: str) -> str:
    """binutils' reading of the build ID: the reference the probe's own parser is checked against."""
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def test_the_probe_reads_the_build_id_that_readelf_reads():
    probe = load_probe()
    libraries = elf_libraries()
    assert len(libraries) >= 2, libraries
    for path in libraries:
        assert probe.nccl_facts(path, "x")["buildId"] == readelf_build_id(path), path


def test_the_probe_finds_the_hosts_nccl_through_the_linkers_cache_with_the_version_of_its_file(tmp_path, monkeypatch):
    probe = load_probe()
    real = tmp_path / "libnccl.so.2.28.9"
    shutil.copy(elf_libraries()[0], real)
    (tmp_path / "libnccl.so.2").symlink_to(real.name)
    cache = (f"3 libs found in cache `/etc/ld.so.cache'\n\tlibz.so.1 (libc6,AArch64) => /usr/lib/libz.so.1\n"
             f"\tlibnccl.so.2 (libc6,AArch64) => {tmp_path / 'libnccl.so.2'}\n")
    monkeypatch.setattr(probe, "sh", lambda argv, timeout: (0, cache, "") if argv[1:] == ["-p"] else None)
    assert probe.host_nccl({"stepTimeout": 5}) == {
        "path": str(tmp_path / "libnccl.so.2"), "real": str(real), "version": "2.28.9",
        "buildId": readelf_build_id(str(real)), "size": real.stat().st_size}
    monkeypatch.setattr(probe, "sh", lambda argv, timeout: (0, "1 libs found\n\tlibz.so.1 (libc6) => /x\n", ""))
    assert probe.host_nccl({"stepTimeout": 5}) == {"missing": True}


def test_a_file_that_is_not_elf_is_an_error_not_a_guess(tmp_path):
    text = tmp_path / "libnccl.so.2"
    text.write_text("not a library")
    assert load_probe().nccl_facts(str(text), None)["error"] == f"ValueError: {text} is not a 64-bit ELF file"


def load(tmp_path, preflight_on=True, **nccl):
    cfg = stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": preflight_on})
    if nccl:
        cfg["spark-vllm:nccl"] = nccl
    return loader.load("test", cfg, set(), ROOT)


def test_the_setting_is_off_by_default_and_needs_preflight(tmp_path):
    assert load(tmp_path).host_nccl is False and load(tmp_path, hostLibrary=True).host_nccl is True
    for bad, message in [
        ({"hostLibrary": "sometimes"}, "spark-vllm:nccl.hostLibrary is 'sometimes'; expected true or false."),
        ({"hostLibary": True}, "spark-vllm:nccl.hostLibary (True) is not a known key (did you mean hostLibrary?); "
                               "expected one of the known keys: hostLibrary."),
    ]:
        with pytest.raises(ConfigError) as err:
            load(tmp_path, **bad)
        assert str(err.value) == f"Pulumi.test.yaml: {message}"
    with pytest.raises(ConfigError) as err:
        load(tmp_path, preflight_on=False, hostLibrary=True)
    assert str(err.value) == (
        "Pulumi.test.yaml: spark-vllm:nccl.hostLibrary is true, but where each host's library is and which file of "
        "the image it covers is what preflight finds, and preflight is off; expected false while preflight.enabled "
        "is false.")


def with_nccl(host=HOST_NCCL, pip=PIP_NCCL) -> dict:
    facts = healthy()
    for node in facts.values():
        if host is not None:
            node["nccl"] = dict(host)
        if pip is not None:
            node["image"]["inside"]["nccl"] = dict(pip)
    return facts


def test_preflight_shows_both_libraries_and_which_one_serves(tmp_path):
    status, reason, _ = one(load(tmp_path), with_nccl(), "spark2", "nccl")
    assert status == "ok" and reason == (
        f"host 2.28.9 (build c0db93601111, {HOST}.28.9); image 2.28.9 (build a7f420a10000, {PIP}); one version, two "
        "builds; the serve uses the image's")
    status, reason, _ = one(load(tmp_path, hostLibrary=True), with_nccl(), "spark2", "nccl")
    assert status == "ok" and reason.endswith(f"the serve uses the host's (nccl.hostLibrary), mounted read-only "
                                              f"over {PIP}")
    # Without the setting a host without NCCL is no problem, and says so.
    assert one(load(tmp_path), with_nccl(host={"missing": True}), "spark3", "nccl")[:2] == (
        "ok", f"the host has none; image 2.28.9 (build a7f420a10000, {PIP}); the serve uses the image's")


def test_with_the_setting_a_host_without_nccl_or_an_image_without_pip_nccl_is_refused(tmp_path):
    d = load(tmp_path, hostLibrary=True)
    assert one(d, with_nccl(host={"missing": True}), "spark2", "nccl") == (
        "fail", "nccl.hostLibrary is on, but the host has none (`ldconfig -p` lists no libnccl.so.2)",
        "install NCCL on the host (DGX OS: the libnccl2 package), or set spark-vllm:nccl.hostLibrary false")
    assert one(d, with_nccl(pip=None), "spark2", "nccl") == (
        "fail", "nccl.hostLibrary is on, but the image has no pip NCCL: there is no library of vLLM's pip packages "
                "to cover",
        "use an image whose vLLM brings NCCL with pip (nvidia-nccl-cu*), or set spark-vllm:nccl.hostLibrary false")


def mounts(reg) -> list[dict]:
    return [m for m in reg.inputs["mounts"] if m["target"].endswith("libnccl.so.2")]


@pytest.mark.parametrize("executor, names", [
    ("ray", ("ray-head-container", "ray-worker-spark2-container", "ray-worker-spark3-container")),
    ("mp", ("vllm-rank-spark1-container", "vllm-rank-spark2-container", "vllm-rank-spark3-container"))])
def test_every_engine_container_mounts_its_hosts_library_read_only_over_the_pip_one(tmp_path, monkeypatch, executor,
                                                                                    names):
    facts = with_nccl()
    facts["spark3"]["nccl"]["real"] = HOST + ".29.1"  # one node's host has another build: its own is mounted
    if executor == "mp":
        facts["spark1"]["ports"] = {"29501": {"free": True}, "8000": {"free": True}, "29511": {"free": True}}
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))

    def program(on: bool):
        return run_program(stack_config(write_catalog(tmp_path / f"catalog{on}"), preflight={"enabled": True},
                                        serve={"executor": executor}, nccl={"hostLibrary": on}))

    on, off = program(True), program(False)
    for name, real in zip(names, (HOST + ".28.9", HOST + ".28.9", HOST + ".29.1")):
        assert mounts(on.by_name(name)) == [{"type": "bind", "source": real, "target": PIP, "readOnly": True}]
        assert mounts(off.by_name(name)) == []
        # Nothing else of the container changes with the setting: turning it on or off restarts the engines alone.
        assert ({k: v for k, v in on.by_name(name).inputs.items() if k not in ("mounts", "labels")}
                == {k: v for k, v in off.by_name(name).inputs.items() if k not in ("mounts", "labels")})
    if executor == "mp":  # the ranks restart together: their shared digest follows the mounts
        digest = [json.dumps(r.inputs["labels"]) for r in (on.by_name(names[0]), off.by_name(names[0]))]
        assert digest[0] != digest[1]


def test_with_the_setting_on_an_image_pulled_by_this_up_is_refused_with_the_way_out(tmp_path):
    """A pulled image arrives during `up`: where it keeps NCCL is not known before, so the mount cannot be planned.
    (A node that gets a copy is judged by the image of the node it is copied from.)"""
    cfg = stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True}, images={"pull": "head"},
                       nccl={"hostLibrary": True})
    facts = with_nccl()
    for node in facts.values():
        node["image"] = {"present": False}
    assert one(loader.load("test", cfg, set(), ROOT), facts, "spark1", "nccl") == (
        "fail", "nccl.hostLibrary is on, but the image is on no node yet to find its pip NCCL in (this `up` pulls it)",
        "deploy once with the setting off, then turn it on, or set spark-vllm:nccl.hostLibrary false")
    assert one(load(tmp_path, hostLibrary=True), {**with_nccl(), "spark2": {**with_nccl()["spark2"], "image": {
        "present": False}}}, "spark2", "nccl")[0] == "ok"  # spark2 gets spark1's copy, judged by spark1's image
