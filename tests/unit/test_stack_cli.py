"""The scripts' view of a stack through the Pulumi CLI, against a stand-in `pulumi` that records its calls."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from components.nodes import node_runner
from components import stack_cli
from components.config.loader import load
from fixtures import stack_config, write_catalog
from harness import ROOT

FAKE_PULUMI = """#!/bin/sh
echo "$@" >> "$OUT/calls"
case "$1 $2" in
  "stack --show-name") echo selected ;;
  "config --show-secrets") cat "$OUT/config.json" ;;
esac
"""


def fake_pulumi(tmp_path, monkeypatch, config: dict, secret: frozenset = frozenset()):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(FAKE_PULUMI)
    (bin_dir / "pulumi").chmod(0o755)
    # As `pulumi config --json` prints them: structured values also as objectValue.
    (tmp_path / "config.json").write_text(json.dumps(
        {key: {"value": value, "secret": key in secret} if isinstance(value, str) else
         {"value": json.dumps(value), "objectValue": value, "secret": key in secret}
         for key, value in config.items()}))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("OUT", str(tmp_path))


def test_a_named_stack_is_read_without_selecting_it(tmp_path, monkeypatch):
    fake_pulumi(tmp_path, monkeypatch, stack_config(write_catalog(tmp_path / "catalog")))
    selected = stack_cli.read(ROOT, "other")
    assert selected.name == "other" and selected.deployment.cluster.name == "c3"
    assert (tmp_path / "calls").read_text().splitlines() == ["config --show-secrets --json --stack other"]


def test_a_gateway_stack_is_read_as_a_gateway(tmp_path, monkeypatch):
    from components.config.gateway_config import GatewaySpec

    config = {"spark-vllm:catalog": str(write_catalog(tmp_path / "catalog")), "spark-vllm:cluster": "c3",
              "spark-vllm:gateway": {"models": ["qa", "qb"], "node": "spark2"}, "spark-vllm:gatewayKey": "sk-gw"}
    fake_pulumi(tmp_path, monkeypatch, config, secret=frozenset({"spark-vllm:gatewayKey"}))
    selected = stack_cli.read(ROOT, "gw")
    assert isinstance(selected.deployment, GatewaySpec)
    assert (selected.deployment.node.name, selected.deployment.models) == ("spark2", ("qa", "qb"))
    assert selected.values["spark-vllm:gatewayKey"] == "sk-gw"


def test_without_a_name_the_selected_stack_is_read(tmp_path, monkeypatch):
    fake_pulumi(tmp_path, monkeypatch, stack_config(write_catalog(tmp_path / "catalog")))
    assert stack_cli.read(ROOT, None).name == "selected"
    assert (tmp_path / "calls").read_text().splitlines() == ["stack --show-name",
                                                            "config --show-secrets --json --stack selected"]


def test_stream_runs_the_command_with_this_terminals_output_on_a_connection_of_its_own(tmp_path, monkeypatch, capfd):
    which = 'case "$*" in *ControlMaster*) echo shared;; *ControlPath=none*) echo own;; esac >&2'
    (tmp_path / "ssh").write_text(f'#!/bin/sh\n{which}\nfor last; do :; done\nexec sh -c "$last"\n')
    (tmp_path / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cluster = load("t", stack_config(write_catalog(tmp_path / "catalog")), set(), ROOT).cluster
    assert node_runner.stream(cluster.ssh, cluster.head, None, "echo line one; exit 3") == 3
    assert capfd.readouterr() == ("line one\n", "own\n")


def test_stream_passes_a_sigterm_on_to_ssh(tmp_path):
    """A stopped `scripts/logs -f` must not leave its ssh (here: a sleep) holding the output."""
    (tmp_path / "ssh").write_text('#!/bin/sh\nfor last; do :; done\nexec sh -c "$last"\n')
    (tmp_path / "ssh").chmod(0o755)
    catalog = write_catalog(tmp_path / "catalog")
    program = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'tests/unit')!r})\n"
               "from components.nodes import node_runner\nfrom components.config.loader import load\n"
               "from fixtures import stack_config\nfrom pathlib import Path\n"
               f"cluster = load('t', stack_config(Path({str(catalog)!r})), set(), Path({str(ROOT)!r})).cluster\n"
               "sys.exit(node_runner.stream(cluster.ssh, cluster.head, None, 'echo started; exec sleep 60'))\n")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "HOME": str(tmp_path / "home")}
    child = subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "started\n"
    child.terminate()
    out, _ = child.communicate(timeout=10)  # EOF: no process holds the output any more
    assert child.returncode == 128 + signal.SIGTERM


# A missing selection or a missing stack is one sentence that names the fix, never a traceback: the stand-in below
# answers as the CLI does then (its message, its exit status).
@pytest.fixture
def cli(tmp_path, monkeypatch):
    def answer(stdout: str, stderr: str, code: int) -> None:
        fake = tmp_path / "pulumi"
        fake.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\nprintf '%s\\n' '{stderr}' >&2\nexit {code}\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return answer


def test_no_selected_stack_names_the_fix(cli, tmp_path):
    cli("", "error: no stack selected; please use `pulumi stack select` to choose one", 255)
    with pytest.raises(SystemExit) as e:
        stack_cli.read(tmp_path, None)
    assert str(e.value) == (f"no stack is selected in {tmp_path}: name one with `--stack <name>`, or select one with "
                            "`pulumi stack select <name>` (`pulumi stack ls` lists them)")


def test_a_missing_stack_names_the_fix(cli, tmp_path):
    cli("", "error: no stack named 'nope' found", 255)
    with pytest.raises(SystemExit) as e:
        stack_cli.read(tmp_path, "nope")
    assert str(e.value) == ("no stack named 'nope' in this backend: `pulumi stack ls` lists the stacks here (for the "
                            "lab's stacks, `. ~/.cache/spark-vllm/try-lab/lab.env` first)")
