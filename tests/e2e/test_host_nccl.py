"""nccl.hostLibrary on the two-node lab with `executor: mp` (docs/host-nccl.md, issue 36): preflight shows both NCCL
libraries of every node, the serve maps the host's while the setting is on and the image's once it is off again,
turning it on or off restarts the ranks alone, and a node whose host has no NCCL is refused with nothing changed.

The lab's libraries are stand-ins (lab/nccl_stand_in): two builds of one small library with NCCL's soname, the host's
in each node's linker cache, the image's where vLLM's pip packages put NCCL. The vLLM double maps the image's path,
as torch does, and asks it its version (lab/vllm_double/README.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import lab_stack, node_sh
from labstack import chat, planned

HOST_LINK = "/usr/lib/*/libnccl.so.2"


@pytest.fixture(scope="module")
def hn(lab2, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab2, "hostnccl", executor="mp", up=True)


def rank(s, node: int) -> str:
    return f"spark-vllm-{s.stack}-vllm-rank{node - 1}"


def pip_path(s) -> str:
    """Where the image's pip packages keep NCCL, as the double (like torch) finds it."""
    ask = "python3 -c 'from vllm import nccl; print(nccl.library_path())'"
    return node_sh(1, f"docker exec {rank(s, 1)} {ask}").strip()


def host_file(node: int) -> str:
    return node_sh(node, f"readlink -f {HOST_LINK}").strip()


def sha256(node: int, where: str) -> str:
    return node_sh(node, f"{where} sha256sum").split()[0]


def mapped(s, node: int, path: str) -> str:
    """The SHA-256 of the NCCL library the rank's serve process (pid 1 of its container) has mapped: the file its
    maps name, which must be the one at `path` in its mount namespace (same inode), read there."""
    maps = node_sh(node, f"docker exec {rank(s, node)} grep libnccl.so.2 /proc/1/maps")
    inodes = {line.split()[4] for line in maps.splitlines()}
    assert {line.split()[5] for line in maps.splitlines()} == {path}, maps
    assert inodes == {node_sh(node, f"docker exec {rank(s, node)} stat -c %i {path}").strip()}, maps
    return sha256(node, f"docker exec {rank(s, node)} cat {path} |")


def readelf_build_id(node: int, file: str, tmp_path) -> str:
    """binutils' reading of a node's file, copied here: the reference for what preflight shows."""
    copy = tmp_path / f"node{node}-{file.rsplit('/', 1)[-1]}"
    copy.write_bytes(subprocess.run(["docker", "exec", f"svl-lab-node{node}", "cat", file], capture_output=True,
                                    check=True).stdout)
    out = subprocess.run(["readelf", "-n", str(copy)], capture_output=True, text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def image_copy(s, tmp_path) -> Path:
    """The image's own pip library, copied out of the image (not out of a running rank, which may cover it)."""
    image = node_sh(1, f"docker inspect -f '{{{{.Image}}}}' {rank(s, 1)}").strip()
    out = tmp_path / "image-libnccl.so.2"
    out.write_bytes(subprocess.run(["docker", "exec", "svl-lab-node1", "docker", "run", "--rm", "--network", "none",
                                    "--entrypoint", "cat", image, pip_path(s)], capture_output=True, check=True).stdout)
    return out


def test_preflight_shows_both_libraries_and_the_serve_maps_the_images(hn, tmp_path):
    path, lib = pip_path(hn), image_copy(hn, tmp_path)
    image_id = re.search(r"Build ID: ([0-9a-f]+)", subprocess.run(["readelf", "-n", str(lib)], capture_output=True,
                                                                  text=True, check=True).stdout).group(1)
    preview = hn.pulumi("preview", "--expect-no-changes", check=True)
    for node in (1, 2):
        host = host_file(node)
        row = f"node{node}  nccl          ok      host 2.28.9 (build {readelf_build_id(node, host, tmp_path)[:12]}, " \
              f"{host}); image 2.28.9 (build {image_id[:12]}, {path}); one version, two builds; the serve uses the " \
              "image's"
        assert row in preview.output, preview.output
        assert mapped(hn, node, path) == subprocess.run(["sha256sum", str(lib)], capture_output=True, text=True,
                                                        check=True).stdout.split()[0]


def switch(s, on: bool) -> None:
    """nccl.hostLibrary set, previewed (the ranks alone are replaced), then deployed and answering."""
    s.set_config("nccl.hostLibrary", str(on).lower())
    changed = planned(s.pulumi("preview", check=True))
    assert {name for name, op in changed.items() if op == "replace" and name.endswith("-container")} == {
        "vllm-rank-node1-container", "vllm-rank-node2-container"}, changed
    assert not [name for name in changed if name.startswith(("fabric-guard", "memory-claim", "node"))], changed
    s.up()
    out = s.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"]
    assert "vLLM is using nccl==2.28.9" in node_sh(1, f"docker logs {rank(s, 1)} 2>&1")


def test_on_every_rank_maps_its_hosts_library_and_the_ranks_alone_restart(hn):
    switch(hn, True)
    path = pip_path(hn)
    for node in (1, 2):
        assert mapped(hn, node, path) == sha256(node, f"cat {host_file(node)} |"), node


def test_with_the_setting_on_a_host_without_nccl_is_refused_and_nothing_changes(hn):
    ids = hn.outputs()["containerIds"]
    folder = node_sh(2, f"dirname $(ls {HOST_LINK})").strip()
    # Both the link and its file, as removing the package does: ldconfig would make the link again from the file.
    node_sh(2, f"mkdir -p /root/nccl-away && mv {folder}/libnccl.so.2* /root/nccl-away/ && ldconfig")
    try:
        for verb in ("preview", "up"):
            run = hn.pulumi(verb, *(["--skip-preview"] if verb == "up" else []))
            assert run.returncode != 0
            assert ("node2  nccl          FAIL    nccl.hostLibrary is on, but the host has none (`ldconfig -p` lists "
                    "no libnccl.so.2)") in run.output, run.output
            assert "nothing was deployed or changed" in run.output
    finally:
        node_sh(2, f"mv /root/nccl-away/* {folder}/ && ldconfig")
    assert hn.outputs()["containerIds"] == ids


def test_off_every_rank_maps_the_images_library_again(hn, tmp_path):
    image_sha = subprocess.run(["sha256sum", str(image_copy(hn, tmp_path))], capture_output=True, text=True,
                               check=True).stdout.split()[0]
    switch(hn, False)
    path = pip_path(hn)
    for node in (1, 2):
        assert mapped(hn, node, path) == image_sha, node
    hn.pulumi("preview", "--expect-no-changes", check=True)
