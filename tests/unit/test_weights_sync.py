"""The weights sync: its place in the graph, when it runs, its secrets, and its script against a stand-in rsync."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest

from components.nodes.node_facts import parse
from components import preflight
from components.resources import weights_sync
from components.config.loader import load
from components.nodes.node_runner import rsync_argv
from fixtures import KEY, stack_config, write_catalog
from harness import ROOT, plain_strings, run_program
from test_preflight_checks import MODEL_FILES, SHARDS, healthy

COMMAND = "command:remote:Command"


def program(tmp_path, monkeypatch, facts=None, clusters=None, **checks):
    facts = facts if facts is not None else healthy()
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    catalog = write_catalog(tmp_path / "catalog", clusters)
    return run_program(stack_config(catalog, preflight={"enabled": True, **checks}))


def test_no_sync_unless_it_is_turned_on(tmp_path, monkeypatch):
    rec = program(tmp_path, monkeypatch)
    assert not any(name.startswith("weights-sync") for name in rec.names())
    assert not any("WeightsSync" in urn for urn in rec.by_name("ray-worker-spark2-container").dependencies)


def test_every_engine_waits_for_the_syncs_run_on_the_head_over_the_fabric(tmp_path, monkeypatch):
    rec = program(tmp_path, monkeypatch, syncWeights=True)
    component = rec.by_name("weights-sync")
    assert component.type == "spark-vllm:index:WeightsSync"
    assert rec.names(COMMAND) >= {"weights-sync-spark2", "weights-sync-spark3"}
    for worker, ip in (("spark2", "192.168.200.2"), ("spark3", "192.168.200.3")):
        sync = rec.by_name(f"weights-sync-{worker}")
        assert sync.parent == component.urn
        assert sync.inputs["create"].startswith(f"sh -s -- spark1 {worker} {ip} /models/big 3600 rsync -a --whole-file "
                                                f"--copy-links '--exclude=/.*' --size-only ")
        assert sync.inputs["create"].endswith(f" /models/big/ nvidia@{ip}:/models/big/")
        assert sync.inputs["connection"]["value"]["host"] == "10.10.10.11"  # rsync runs on the head
        container = rec.by_name(f"ray-worker-{worker}-container")
        assert sync.urn in container.dependencies
    assert "10.10.10.13" not in rec.by_name("weights-sync-spark3").inputs["create"]  # spark3's management address
    # The head waits for them too: nothing that runs is replaced before every node holds the weights.
    head = rec.by_name("ray-head-container")
    assert {rec.by_name(f"weights-sync-{w}").urn for w in ("spark2", "spark3")} <= set(head.dependencies)


def test_equal_weights_leave_the_sync_alone_and_a_difference_runs_it(tmp_path, monkeypatch):
    rec = program(tmp_path, monkeypatch, syncWeights=True)
    for worker in ("spark2", "spark3"):
        sync = rec.by_name(f"weights-sync-{worker}")
        assert sync.ignore_changes == ["triggers", "create", "stdin", "connection"]
        assert len(sync.inputs["triggers"]) == 1 and sync.inputs["triggers"][0].startswith("manifests ")
    equal_trigger = rec.by_name("weights-sync-spark2").inputs["triggers"][0]

    facts = healthy()
    facts["spark2"]["model"]["files"] = [f for f in MODEL_FILES if f[0] != SHARDS[2]]
    rec = program(tmp_path / "differ", monkeypatch, facts=facts, syncWeights=True)
    sync = rec.by_name("weights-sync-spark2")
    assert sync.ignore_changes == []
    manifests, found = sync.inputs["triggers"]
    assert manifests.startswith("manifests ") and manifests != equal_trigger
    assert found.startswith("found different at 20") and found.endswith("Z")
    assert rec.by_name("weights-sync-spark3").ignore_changes == ["triggers", "create", "stdin", "connection"]


def test_the_same_difference_found_again_changes_the_trigger(tmp_path):
    d = load("t", stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True, "syncWeights": True}),
             set(), ROOT)
    facts = healthy()
    facts["spark2"]["model"]["files"] = [f for f in MODEL_FILES if f[0] != SHARDS[2]]
    typed = {name: parse(raw) for name, raw in facts.items()}
    first = weights_sync.plan(d.cluster, d.preflight, typed, d.cluster.head, now=0)
    again = weights_sync.plan(d.cluster, d.preflight, typed, d.cluster.head, now=3600)
    assert first["spark2"].needed and first["spark2"].triggers[0] == again["spark2"].triggers[0]
    assert first["spark2"].triggers != again["spark2"].triggers
    assert first["spark3"] == again["spark3"] == weights_sync.SyncPlan(False, first["spark3"].triggers)


def test_hashed_weights_are_compared_by_checksum(tmp_path, monkeypatch):
    facts = healthy()
    for f in facts.values():
        f["model"]["sha256"] = {name: "0" * 64 for name in SHARDS}
    rec = program(tmp_path, monkeypatch, facts=facts, syncWeights=True, hashWeights=True, syncTimeoutSeconds=600)
    assert " /models/big 600 rsync -a --whole-file --copy-links '--exclude=/.*' --checksum " in \
        rec.by_name("weights-sync-spark2").inputs["create"]


def test_the_key_reaches_the_sync_only_inside_secrets(tmp_path, monkeypatch):
    rec = program(tmp_path, monkeypatch, syncWeights=True)
    key_body = "unit-test-key-material"
    for reg in rec.resources.values():
        assert not any(key_body in text for text in plain_strings(reg.inputs)), reg.name
    sync = rec.by_name("weights-sync-spark2").inputs
    assert plain_strings(sync["stdin"]) == [] and base64.b64encode(KEY.encode()).decode() in sync["stdin"]["value"]
    assert plain_strings(sync["connection"]) == []
    assert key_body not in sync["create"]


def test_without_a_key_file_the_sync_uses_the_heads_own_identity(tmp_path, monkeypatch):
    from fixtures import cluster_with

    clusters = cluster_with(lambda c: c["ssh"].pop("keyFile"))
    rec = program(tmp_path, monkeypatch, clusters=clusters, syncWeights=True)
    stdin = rec.by_name("weights-sync-spark2").inputs["stdin"]
    assert isinstance(stdin, str) and "PRIVATE KEY" not in stdin


# ---- the script, against a stand-in rsync that records what it was given ----

FAKE_RSYNC = r"""#!/bin/sh
# Records its arguments and the key file its ssh command names, then acts as $FAKE_MODE says; the dry run that checks
# the copy records its own, and names what $FAKE_LEFT says was left behind.
out=$FAKE_OUT
case " $* " in
  *" --dry-run "*)
    printf '%s\n' "$@" > "$out/argv.check"
    for name in $FAKE_LEFT; do echo "SPARK_VLLM_LEFT $name"; done
    echo "SPARK_VLLM_LEFT ./"
    exit 0 ;;
esac
printf '%s\n' "$@" > "$out/argv"
ssh=$(for a; do case $prev in -e) printf '%s' "$a" ;; esac; prev=$a; done)
# The key file as ssh would expand it: IdentityFile=${SPARK_VLLM_SSH_DIR}/key.
key=$(printf '%s' "$ssh" | sed -n 's/.*IdentityFile=\${SPARK_VLLM_SSH_DIR}\([^ ]*\).*/\1/p')
[ -n "$key" ] && key=$SPARK_VLLM_SSH_DIR$key
if [ -n "$key" ]; then cp "$key" "$out/key"; stat -c %a "$key" > "$out/key.mode"; echo "$key" > "$out/key.path"; fi
case $FAKE_MODE in
  copy)
    echo "SPARK_VLLM_FILE 4194560 model-00003-of-00004.safetensors"
    printf '      1,048,576  6%%   90.00MB/s    0:00:00\r'
    printf '      4,194,560  24%%   95.12MB/s    0:00:00 (xfr#1, to-chk=0/8)\n'
    ;;
  slow) sleep 30 ;;
  fail) echo "rsync: [sender] change_dir \"/models/big\" failed: No such file or directory (2)"; exit 23 ;;
esac
exit 0
"""


def run_script(tmp_path, mode, key=KEY, limit="60", left="", compare="size"):
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    (bin_dir / "rsync").write_text(FAKE_RSYNC)
    (bin_dir / "rsync").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_OUT": str(out), "FAKE_MODE": mode,
           "TMPDIR": str(tmp_path), "FAKE_LEFT": left}
    worker = load("t", stack_config(write_catalog(tmp_path / "catalog")), set(), ROOT).cluster.node("spark2")
    rsync = rsync_argv("/models/big", worker, "192.168.200.2", compare=compare, with_key=key is not None)
    done = subprocess.run(["sh", "-s", "--", "spark1", "spark2", "192.168.200.2", "/models/big", limit, *rsync],
                          input=weights_sync.sync_script(key), env=env, capture_output=True, text=True, timeout=60)
    return done, out


def test_the_script_copies_over_the_fabric_with_the_key_in_a_private_file_it_removes(tmp_path):
    done, out = run_script(tmp_path, "copy")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == [
        "spark-vllm: syncing spark1:/models/big/ to spark2 (192.168.200.2) over the fabric; files compared by size",
        "spark-vllm: copying model-00003-of-00004.safetensors (4.0 MiB)",
        "spark-vllm: 4.0 MiB copied, 1 file done, at 95.12MB/s, 0:00:00 elapsed"]
    assert len(lines) == 4 and lines[3].startswith("spark-vllm: synced 1 file, 4.0 MiB, from spark1 to spark2 in ")
    assert lines[3].endswith(" GB/s")
    argv = (out / "argv").read_text().splitlines()
    assert argv[:7] == ["--info=progress2", "--out-format=SPARK_VLLM_FILE %l %n", "-a", "--whole-file", "--copy-links",
                        "--exclude=/.*", "--size-only"]
    assert argv[-2:] == ["/models/big/", "nvidia@192.168.200.2:/models/big/"]
    assert "--rsync-path=mkdir -p /models/big && rsync" in argv
    ssh = argv[argv.index("-e") + 1]
    assert "StrictHostKeyChecking=accept-new" in ssh and "BatchMode=yes" in ssh and ssh.endswith(" -p 22")
    assert "UserKnownHostsFile=${SPARK_VLLM_SSH_DIR}/known_hosts" in ssh
    assert (out / "key").read_text() == KEY and (out / "key.mode").read_text().strip() == "600"
    key_path = Path((out / "key.path").read_text().strip())
    assert not key_path.exists() and not key_path.parent.exists()  # the temp folder is gone
    assert "unit-test-key-material" not in done.stdout + done.stderr


def test_no_key_content_can_end_the_key_text_and_run_as_shell(tmp_path):
    marker = tmp_path / "injected"
    hostile = f"-----BEGIN KEY-----\nSPARK_VLLM_KEY\ntouch {marker}\n'; touch {marker}; '\n-----END KEY-----\n"
    done, out = run_script(tmp_path, "copy", key=hostile)
    assert done.returncode == 0, done.stderr
    assert not marker.exists() and (out / "key").read_text() == hostile


def test_the_script_without_a_key_names_none(tmp_path):
    done, out = run_script(tmp_path, "copy", key=None)
    assert done.returncode == 0 and not (out / "key").exists()
    assert "IdentityFile" not in (out / "argv").read_text()


@pytest.mark.parametrize("mode,limit,message", [
    ("slow", "1", "spark-vllm: the sync from spark1 to spark2 did not finish within 1 s "
                  "(spark-vllm:preflight.syncTimeoutSeconds); the files it finished stay, and the next pulumi up "
                  "copies the rest"),
    ("fail", "60", "spark-vllm: rsync from spark1 to spark2 (192.168.200.2) failed with status 23; its messages are "
                   "above"),
])
def test_the_script_fails_with_a_plain_message(tmp_path, mode, limit, message):
    done, out = run_script(tmp_path, mode, limit=limit)
    assert done.returncode == 1
    assert done.stderr.strip() == message
    assert not Path((out / "key.path").read_text().strip()).exists()


def test_after_the_copy_a_dry_run_by_size_checks_that_nothing_is_left(tmp_path):
    done, out = run_script(tmp_path, "copy", compare="checksum")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith("files compared by size and SHA-256 (rsync --checksum)")
    argv, check = (out / "argv").read_text().splitlines(), (out / "argv.check").read_text().splitlines()
    assert "--checksum" in argv and "--checksum" not in check and "--size-only" not in check
    assert check[:2] == ["--dry-run", "--out-format=SPARK_VLLM_LEFT %n"]
    assert check[2:] == [arg for arg in argv[2:] if arg != "--checksum"]  # by size and time, as the copy left them


def test_a_hub_downloads_files_are_compared_by_size_and_time(tmp_path):
    """A new revision's file may keep its size: fetched anew, it has a new time, which the copy carries over."""
    done, out = run_script(tmp_path, "copy", compare="size and time")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith("files compared by size and modification time")
    argv = (out / "argv").read_text().splitlines()
    assert "--size-only" not in argv and "--checksum" not in argv
    assert "--size-only" not in (out / "argv.check").read_text().splitlines()


def test_a_file_the_copy_left_different_fails_the_sync_naming_it(tmp_path):
    done, _ = run_script(tmp_path, "copy", left="model-00003-of-00004.safetensors sub/tokenizer.json")
    assert done.returncode == 1
    assert done.stderr.strip() == ("spark-vllm: after the sync, spark2 still lacks or holds in another size: "
                                   "model-00003-of-00004.safetensors, sub/tokenizer.json; run pulumi up again")


def test_the_script_says_when_there_was_nothing_to_copy(tmp_path):
    done, _ = run_script(tmp_path, "none")
    assert done.returncode == 0
    last = done.stdout.splitlines()[-1]
    assert last.startswith("spark-vllm: nothing to copy: spark2 already had every file of spark1, the same by size "
                           "(checked in ") and last.endswith(" s)")
