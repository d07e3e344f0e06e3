"""The two pieces of shell the program builds from config values, run for real with dash (the nodes' /bin/sh):
the serve's launcher, with the secrets inside it, and the fabric guard's command, with the SSH user inside it.

Each is tried with values that broke it before: the marker file a payload would create must not appear, and
legitimate values must arrive intact.
"""

from __future__ import annotations

import base64
import stat
import subprocess
import time
from pathlib import Path

import pytest

from components.config.spec import NodeSpec
from components.resources.fabric_guard import guard_command
from components.remote.serve_ready import api_key
from components.resources.vllm_serve import start_script

SHELL = "dash"
# What vLLM would get; the stand-in records its environment and arguments instead.
STAND_IN_VLLM = """#!/bin/sh
printf '%s' "$VLLM_API_KEY" > "$OUT/api_key"
printf '%s' "$HF_TOKEN" > "$OUT/hf_token"
printf '%s\\n' "$@" > "$OUT/argv"
"""


def stand_in(folder: Path, name: str, text: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    (folder / name).chmod(0o755)


def launch(tmp_path: Path, secrets: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs the launcher as the serve does (`sh -s -- vllm serve ...`, the script on stdin), in `tmp_path`, with
    its run and log folders moved there, and waits for the stand-in vllm to finish."""
    script = start_script(secrets)
    for fixed, moved in (("run=/run/spark-vllm", f"run={tmp_path}/run"),
                         ("log=/var/log/spark-vllm/serve.log", f"log={tmp_path}/log/serve.log")):
        assert fixed in script
        script = script.replace(fixed, moved)
    stand_in(tmp_path / "bin", "vllm", STAND_IN_VLLM)
    (tmp_path / "out").mkdir()
    done = subprocess.run([SHELL, "-s", "--", "vllm", "serve", "/models/x", "--port", "8000"], input=script,
                          capture_output=True, text=True, cwd=tmp_path, timeout=30,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "OUT": str(tmp_path / "out")})
    for _ in range(100):
        if (tmp_path / "out" / "argv").exists():
            break
        time.sleep(0.05)
    return done


@pytest.mark.parametrize("payload", [
    "k1\nSPARK_VLLM_ENV\ntouch marker\ncat <<'SPARK_VLLM_ENV'",  # ends the old heredoc early
    "k1'; touch marker; '",
    "$(touch marker)",
    "`touch marker`",
    "k1\\\n$(touch marker)",
])
def test_no_secret_value_runs_as_shell_in_the_launcher(tmp_path, payload):
    done = launch(tmp_path, {"apiKey": payload, "hfToken": "hf_abc"})
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "marker").exists()
    assert not (tmp_path / "run" / "marker").exists()
    assert (tmp_path / "out" / "api_key").read_text() == payload
    assert (tmp_path / "out" / "hf_token").read_text() == "hf_abc"


def test_the_secrets_reach_vllms_environment_intact_and_only_there(tmp_path):
    key = "it's a \"key\" with $dollars, `ticks`, \\backslashes\\ and ünïcode"
    done = launch(tmp_path, {"apiKey": key, "hfToken": "hf_abc"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "api_key").read_text() == key
    assert (tmp_path / "out" / "argv").read_text().split("\n")[:5] == ["serve", "/models/x", "--port", "8000", ""]
    env_file = tmp_path / "run" / "serve.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert api_key(str(env_file)) == key  # what the readiness gate sends as its bearer token
    # The script that crosses SSH holds no secret in clear text, only base64.
    script = start_script({"apiKey": key})
    assert key not in script and base64.b64encode(key.encode()).decode() in script


def test_the_launcher_without_secrets_starts_vllm_with_an_empty_env_file(tmp_path):
    done = launch(tmp_path, {})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "api_key").read_text() == ""
    assert (tmp_path / "run" / "serve.env").read_text() == ""


def node(user: str) -> NodeSpec:
    return NodeSpec(name="spark2", head=False, ssh_host="10.0.0.2", ssh_port=22, ssh_user=user, via=None,
                    fabric_ip="192.168.200.2")


def guard(tmp_path: Path, user: str, sudo_works: bool) -> subprocess.CompletedProcess:
    """The guard's apply command for `user`, run with dash in `tmp_path`, with a stand-in sudo (that fails, or runs its
    command) and a stand-in iptables that logs its arguments."""
    stand_in(tmp_path / "bin", "sudo", '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n' if sudo_works else
             "#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n")
    # Its -C (is the chain hooked?) answers no, so the script hooks it.
    stand_in(tmp_path / "bin", "iptables", f'#!/bin/sh\necho "$*" >> {tmp_path}/iptables.log\n[ "$2" != -C ]\n')
    command = guard_command(node(user), "apply", "svl-t-0123abcd", "enp1s0f1np1", "spark-vllm stack t", "6379")
    return subprocess.run([SHELL, "-c", command], capture_output=True, text=True, cwd=tmp_path, timeout=30,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})


@pytest.mark.parametrize("user", ["nvidia'; touch marker; echo '", "o'neil", "$(touch marker)", "a\\c`touch marker`"])
def test_no_user_name_runs_as_shell_in_the_guard_command(tmp_path, user):
    done = guard(tmp_path, user, sudo_works=False)
    assert not (tmp_path / "marker").exists()
    assert done.returncode == 4, done.stderr
    assert done.stderr == (f"fabric guard on spark2: {user} cannot run sudo without a password; allow it (iptables "
                           "needs root) or set ray.fabricGuard: false\n")


def test_the_guard_command_applies_the_chain_through_sudo(tmp_path):
    done = guard(tmp_path, "nvidia", sudo_works=True)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "iptables.log").read_text().splitlines()
    assert "-w -N svl-t-0123abcd" in log
    assert "-w -A svl-t-0123abcd -p tcp --syn --dport 6379 -j REJECT --reject-with tcp-reset" in log
    assert "-w -I INPUT 1 -j svl-t-0123abcd" in log
