"""The Hub download's program (components/remote/hub_download.py), run with the real huggingface_hub client against
the Hub double on loopback: what it fetches, what it leaves alone, how it fails, and that a rerun resumes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.nodes.hub_files import RepoFile, select
from components.resources import weights_download
from harness import ROOT

sys.path.insert(0, str(ROOT / "lab" / "hub_double"))
import server as hub_double  # noqa: E402

TOKENS = {"hf_granted": ["lab/tiny-gated", "lab/tiny-private"]}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    double = hub_double.serve("127.0.0.1", 0, tmp_path_factory.mktemp("hub") / "data", TOKENS)
    yield double
    double.hub.release.set()
    double.shutdown()


def url(hub) -> str:
    return f"http://127.0.0.1:{hub.server_address[1]}"


def spec(hub, path: Path, revision="main", repo="lab/tiny", stall=30) -> dict:
    """What the program gets: the files as preflight's plan lists them, from the double's own repo."""
    commit = hub.hub.repos[repo].resolve(revision)
    blobs = hub.hub.repos[repo].commits[commit]
    files = [RepoFile(p, b.size, b.etag) for p, b in sorted(blobs.items())]
    return {"repo": repo, "revision": revision, "commit": commit, "endpoint": url(hub), "path": str(path),
            "node": "node1", "stallSeconds": stall, "files": [[f.path, f.size, f.etag] for f in files],
            "fetch": [f.path for f in select(files).fetched]}


def run(the_spec: dict, token=None, timeout=120) -> subprocess.CompletedProcess:
    Path(the_spec["path"]).mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": the_spec["path"] + "/../home", "HF_HUB_DISABLE_TELEMETRY": "1",
           "NO_PROXY": "127.0.0.1"}
    return subprocess.run([sys.executable, "-"], input=weights_download.download_program(the_spec, token), env=env,
                          capture_output=True, text=True, timeout=timeout)


def served(hub) -> dict[str, int]:
    with hub.hub.lock:
        return dict(hub.hub.served)


def reset(hub) -> None:
    hub.hub.reset()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_download_fetches_what_vllm_reads_then_nothing_again(hub, tmp_path):
    reset(hub)
    s = spec(hub, tmp_path / "model")
    done = run(s)
    assert done.returncode == 0, done.stdout + done.stderr
    got = sorted(str(p.relative_to(tmp_path / "model")) for p in (tmp_path / "model").rglob("*")
                 if p.is_file() and ".cache" not in p.parts)
    assert got == sorted(s["fetch"]) and "original/consolidated.00.pth" not in got
    blobs = hub.hub.repos["lab/tiny"].commits[s["commit"]]
    assert all(sha(tmp_path / "model" / name) == hashlib.sha256(blobs[name].path.read_bytes()).hexdigest()
               for name in got)
    assert sum(served(hub).values()) == sum(blobs[name].size for name in got)
    record = json.loads((tmp_path / "model/.cache/spark-vllm/hub.json").read_text())
    assert record["complete"] and record["commit"] == s["commit"] and record["revision"] == "main"
    lines = done.stdout.splitlines()
    assert lines[0] == (f"spark-vllm: downloading lab/tiny@{s['commit'][:12]} (main) on node1 into "
                        f"{tmp_path / 'model'} with huggingface_hub 2.4.0: 9 files, 16.0 MiB; 0 already here")
    assert lines[-1].startswith(f"spark-vllm: downloaded lab/tiny@{s['commit'][:12]}: 9 files, 16.0 MiB, in ")
    reset(hub)
    again = run(s)
    assert again.returncode == 0 and served(hub) == {}, again.stdout + again.stderr
    assert "9 already here" in again.stdout


def test_a_new_revision_fetches_only_the_changed_file_and_drops_what_it_no_longer_has(hub, tmp_path):
    reset(hub)
    path = tmp_path / "model"
    old = spec(hub, path)
    old["fetch"].append("README.md")  # fetched by the old revision only: removed when the new one drops it
    assert run(old).returncode == 0
    reset(hub)
    new = spec(hub, path, revision="v2")
    done = run(new)
    assert done.returncode == 0, done.stdout + done.stderr
    assert served(hub) == {"lab/tiny/model-00003-of-00004.safetensors": 4194560}
    assert not (path / "README.md").exists()
    assert "removed 1 files of the previous revision" in done.stdout.splitlines()[-1]


def test_a_stall_fails_naming_the_file_and_the_rerun_keeps_what_finished(hub, tmp_path):
    reset(hub)
    s = spec(hub, tmp_path / "model", stall=2)
    with hub.hub.lock:
        hub.hub.stall_after = 1 << 20  # each file stops after 1 MiB: the small ones finish, the shards hang
        hub.hub.release.clear()
    done = run(s)
    assert done.returncode == 3, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("spark-vllm: the download stalled: no byte of ") and "model-0000" in last
    assert last.endswith("for 2 s (spark-vllm:serve.hub.stallSeconds); the files it finished stay, and the next "
                         "pulumi up fetches the rest")
    assert sum(served(hub).values()) > 0
    reset(hub)  # cuts the stalled responses
    again = run(s)
    assert again.returncode == 0, again.stdout + again.stderr
    # What finished the first time (the files under 1 MiB) is not sent again; the shards cut short are sent whole:
    # huggingface_hub 2.4 keeps no partial file between runs, so a rerun resumes by whole files.
    assert sorted(served(hub)) == [f"lab/tiny/model-0000{k}-of-00004.safetensors" for k in range(1, 5)]
    assert all(n == 4194560 for n in served(hub).values())


def test_a_gated_repo_without_access_fails_in_one_sentence(hub, tmp_path):
    s = spec(hub, tmp_path / "model", repo="lab/tiny-gated")
    done = run(s)
    assert done.returncode == 1
    name = done.stdout.splitlines()[-1].split()[4]  # whichever of its files came first
    assert name in s["fetch"]
    assert done.stdout.splitlines()[-1] == (
        f"spark-vllm: the download of {name} failed: lab/tiny-gated on {url(hub)} is gated, and the stack's hfToken "
        "has no access to it; the files it finished stay, and the next pulumi up fetches the rest")
    granted = run(spec(hub, tmp_path / "granted", repo="lab/tiny-gated"), token="hf_granted")
    assert granted.returncode == 0, granted.stdout


def test_a_download_without_room_stops_before_it_starts(hub, tmp_path):
    reset(hub)
    s = spec(hub, tmp_path / "model")
    s["files"] = [[name, size * (1 << 40) if name.endswith(".safetensors") else size, etag]
                  for name, size, etag in s["files"]]
    done = run(s)
    assert done.returncode == 2 and served(hub) == {}
    assert " free at " in done.stdout and "and the download needs " in done.stdout


def test_the_wrapper_runs_it_in_the_image_as_the_user_with_the_token_on_stdin_only(tmp_path):
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {out}/argv\n'
                                    f'[ "$1" = run ] && cat > {out}/stdin\nexit 0\n')
    (bin_dir / "docker").chmod(0o755)
    text = weights_download.download_script({"repo": "r"}, "hf_wrapper_secret")
    done = subprocess.run(["sh", "-s", "--", "spark-vllm-t-hub-download", "vllm:a", str(tmp_path / "w m")],
                          input=text, capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    argv = (out / "argv").read_text().splitlines()
    assert argv[:3] == ["rm", "-f", "spark-vllm-t-hub-download"]
    run_args = argv[3:]
    assert run_args[:6] == ["run", "--rm", "-i", "--init", "--name", "spark-vllm-t-hub-download"]
    assert f"{tmp_path / 'w m'}:{tmp_path / 'w m'}" in run_args
    assert run_args[-2:] == ["vllm:a", "-"] and "--user" in run_args and "hf_wrapper_secret" not in "".join(argv)
    assert (tmp_path / "w m").is_dir()
    assert "SPARK_VLLM_PY" not in (out / "stdin").read_text() and "def main" in (out / "stdin").read_text()


def test_the_double_counts_what_a_client_that_goes_away_did_not_get(hub, tmp_path):
    """The resume test's measure: bytes the double sent, not bytes it meant to send."""
    reset(hub)
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", hub.server_address[1], timeout=5)
    commit = hub.hub.repos["lab/tiny"].resolve("main")
    conn.request("GET", f"/lab/tiny/resolve/{commit}/model-00001-of-00004.safetensors", headers={"Range": "bytes=0-99"})
    answer = conn.getresponse()
    assert answer.status == 206 and len(answer.read()) == 100
    deadline = time.monotonic() + 5
    while not served(hub) and time.monotonic() < deadline:  # counted once written, just after the client has it
        time.sleep(0.01)
    assert served(hub) == {"lab/tiny/model-00001-of-00004.safetensors": 100}


def test_the_doubles_own_routes_answer_over_http(hub):
    import urllib.request
    reset(hub)
    with urllib.request.urlopen(f"{url(hub)}/_double/stats", timeout=5) as r:
        assert json.load(r) == {"served": {}, "requests": []}
