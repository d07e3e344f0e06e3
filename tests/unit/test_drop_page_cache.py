"""serve.dropPageCache: a command on every node that the serve waits for, run again before every (re)start of the
serve and never on a no-op; and its script, against local stand-ins."""

from __future__ import annotations

import os
import subprocess

from fixtures import stack_config, write_catalog
from harness import ROOT, plain_strings, run_program

SCRIPT = (ROOT / "components" / "remote" / "drop_page_cache.sh").read_text()
DROPS = {f"vllm-serve-drop-cache-spark{k}" for k in (1, 2, 3)}


def program(tmp_path, serve=None, **extra):
    catalog = tmp_path / "catalog"
    if not catalog.exists():
        write_catalog(catalog)
    return run_program(stack_config(catalog, serve={"dropPageCache": True, **(serve or {})}, **extra),
                       secret_keys=tuple(f"spark-vllm:{k}" for k in extra))


def test_off_by_default(tmp_path):
    rec = run_program(stack_config(write_catalog(tmp_path / "catalog")))
    assert not any("drop-cache" in name for name in rec.names())


def test_every_node_drops_its_cache_before_the_serve_starts(tmp_path):
    rec = program(tmp_path)
    assert DROPS <= rec.names("command:remote:Command")
    serve = rec.by_name("vllm-serve-process")
    for node, host in (("spark1", "10.10.10.11"), ("spark2", "192.168.200.2"), ("spark3", "10.10.10.13")):
        drop = rec.by_name(f"vllm-serve-drop-cache-{node}")
        assert drop.parent == rec.by_name("vllm-serve").urn
        assert drop.inputs["create"] == f"sh -s -- {node}"
        assert drop.inputs["stdin"] == SCRIPT
        assert drop.inputs["connection"]["value"]["host"] == host  # on the node itself, spark2 through spark1
        assert "*" in drop.replace_on_changes
        assert drop.urn in serve.dependencies
        cluster_ready, create, _digest = drop.inputs["triggers"]
        assert cluster_ready == rec.by_name("cluster-ready-gate").id and create == serve.inputs["create"]
    assert rec.by_name("vllm-serve-drop-cache-spark2").inputs["connection"]["value"]["proxy"]["host"] == "10.10.10.11"


def keys(rec) -> dict[str, str]:
    return {name: rec.by_name(name).replace_key() for name in DROPS | {"vllm-serve-process"}}


def test_it_runs_again_exactly_when_the_serve_restarts(tmp_path):
    base = keys(program(tmp_path, apiKey="key-1"))
    assert keys(program(tmp_path, apiKey="key-1")) == base  # a no-op: nothing reruns
    for serve, extra in [({"maxModelLen": 2048}, {"apiKey": "key-1"}), ({}, {"apiKey": "key-2"})]:
        changed = keys(program(tmp_path, serve=serve, **extra))
        assert all(changed[name] != base[name] for name in base), (serve, extra)


def test_the_secrets_enter_its_triggers_only_as_a_secret_digest(tmp_path):
    rec = program(tmp_path, apiKey="sk-drop-cache-secret")
    for name in DROPS:
        triggers = rec.by_name(name).inputs["triggers"]
        assert plain_strings(triggers[2]) == [] and "sk-drop-cache-secret" not in str(triggers)


# ---- the script ----

def run_script(tmp_path, *args, fake_user=False):
    env = dict(os.environ)
    if fake_user:  # a user who is not root, whose sudo asks for a password
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "id").write_text('#!/bin/sh\ncase $1 in -u) echo 1000 ;; -un) echo nvidia ;; esac\n')
        (bin_dir / "sudo").write_text('#!/bin/sh\necho "sudo: a password is required" >&2\nexit 1\n')
        for tool in ("id", "sudo"):
            (bin_dir / tool).chmod(0o755)
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return subprocess.run(["sh", "-s", "--", *args], input=SCRIPT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_script_writes_1_and_reports_the_cache(tmp_path):
    target = tmp_path / "drop_caches"
    done = run_script(tmp_path, "spark2", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_text() == "1\n"
    assert done.stdout.startswith("spark-vllm: dropped the page cache on spark2 (cached: ")
    assert done.stdout.rstrip().endswith(" GiB after)")


def test_the_script_names_the_node_when_it_is_not_permitted(tmp_path):
    done = run_script(tmp_path, "spark2", fake_user=True)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "spark-vllm: could not drop the page cache on spark2 as nvidia: sudo: a password is required. Fix: connect as "
        "root, or let nvidia run `sudo -n tee /proc/sys/vm/drop_caches` without a password, or set "
        "spark-vllm:serve.dropPageCache to false")
    target = tmp_path / "missing" / "drop_caches"
    done = run_script(tmp_path, "spark3", str(target))
    assert done.returncode == 1
    assert done.stderr.startswith("spark-vllm: could not drop the page cache on spark3 as root: ")
    assert "Directory nonexistent" in done.stderr or "No such file" in done.stderr
