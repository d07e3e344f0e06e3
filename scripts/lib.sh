# Shared set-up steps for scripts/try-lab and scripts/test. Each step is idempotent and quick when done.
# shellcheck shell=bash

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Debian packages, installed only when a command is missing.
ensure_packages() {
  local missing=() cmd pkg
  for pair in "$@"; do
    cmd=${pair%%:*} pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
  say "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# A running Docker engine: Debian's docker.io, started by hand where no init system manages it.
ensure_docker() {
  ensure_packages dockerd:docker.io
  docker info >/dev/null 2>&1 && return 0
  local log=${SPARK_VLLM_DOCKERD_LOG:-/var/log/spark-vllm-dockerd.log}
  say "starting dockerd (log: $log)"
  # The daemon outlives this script, so it keeps none of the caller's descriptors: under
  # `flock /tmp/spark-vllm-lab.lock scripts/test` it would hold the lab's lock until the machine stops.
  local fd closes=() i
  for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    [ "$fd" -gt 2 ] && closes+=("$fd>&-")
  done
  eval "nohup dockerd >\"\$log\" 2>&1 ${closes[*]} &"
  for i in $(seq 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 1
  done
  tail -20 "$log" >&2
  die "dockerd did not answer within 60 s"
}

# The project's virtualenv (the one Pulumi.yaml names), with the pinned requirements, installed by uv (pinned here;
# its advisories, the newest fixed in 0.11.15, all predate it).
UV_PIN=uv==0.13.9
ensure_venv() {
  local req=${1:-requirements.txt} stamp
  [ -x "$REPO/.venv/bin/python" ] || python3 -m venv "$REPO/.venv"
  stamp="$REPO/.venv/.installed-$(cat "$REPO/requirements.txt" "$REPO/$req" | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && return 0
  say "installing $req into .venv"
  # uv fetches and unpacks the packages in parallel, where pip does one at a time: a fresh venv took pip 68 s
  # beside the lab's start, uv 13 s (6 s from its cache), its own install included. Like pip --no-compile, uv
  # leaves each module to be compiled when first imported. The venv keeps pip (python -m venv), which Pulumi's
  # toolchain and a test use.
  "$REPO/.venv/bin/pip" install -q --disable-pip-version-check "$UV_PIN"
  "$REPO/.venv/bin/uv" pip install -q --python "$REPO/.venv/bin/python" -r "$REPO/$req"
  touch "$stamp"
}

# The Pulumi engine (CLI, Python language host, command provider), built once from Go modules.
ensure_pulumi() {
  local bin
  bin=$("$REPO/scripts/install-pulumi") || die "could not set up the Pulumi engine (see above)"
  export PATH="$bin:$PATH" PULUMI_SKIP_UPDATE_CHECK=1
}

# scripts/try-lab's stack: its project folder and state (a user's own, which the lab tests must not break).
TRY_LAB_DIR=${SPARK_VLLM_TRY_LAB_DIR:-$CACHE/try-lab}
try_lab_env() {
  export PULUMI_BACKEND_URL=${PULUMI_BACKEND_URL:-file://$CACHE/state}
  export PULUMI_CONFIG_PASSPHRASE=${PULUMI_CONFIG_PASSPHRASE-lab}
  export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
  export PATH="$REPO/tests/docker_double:$REPO/tests/command_double:$PATH"
}

# The try-lab stacks: the one-model stack, and the several-models example (its gateway last, destroyed first).
TRY_LAB_STACKS=(lab lab-n1 lab-n2 lab-gateway)

# Pulumi.<stack>.yaml copied into the try-lab folder, with what Pulumi and the user wrote into the copy before kept:
# its encryption salt and its secrets (a secret set there is not lost to the next copy).
copy_stack_file() {
  "$REPO/.venv/bin/python" - "$REPO/Pulumi.$1.yaml" "$TRY_LAB_DIR/Pulumi.$1.yaml" <<'PY'
import os, sys, yaml
source, copy = sys.argv[1:]
text = open(source).read().rstrip("\n") + "\n"
settings = yaml.safe_load(text)["config"]
old = yaml.safe_load(open(copy)) if os.path.exists(copy) else {}
for key, value in ((old or {}).get("config") or {}).items():
    if isinstance(value, dict) and "secure" in value and key not in settings:
        text += f"  {key}:\n    secure: {value['secure']}\n"
if (old or {}).get("encryptionsalt"):
    text += f"encryptionsalt: {old['encryptionsalt']}\n"
open(copy + ".new", "w").write(text)
os.replace(copy + ".new", copy)
PY
}

# Whether a try-lab stack (lab, or another named) is deployed: it has an endpoint in its state.
try_lab_deployed() {
  local stack stacks=("$@")
  [ $# -gt 0 ] || stacks=("${TRY_LAB_STACKS[@]}")
  [ -d "$TRY_LAB_DIR" ] || return 1
  for stack in "${stacks[@]}"; do
    (try_lab_env && cd "$TRY_LAB_DIR" && pulumi stack output baseUrl --stack "$stack" >/dev/null 2>&1) && return 0
  done
  return 1
}

# Destroys the try-lab stacks that exist, the gateway first; the lab stays up.
try_lab_destroy() {
  local stack
  for stack in lab-gateway lab-n2 lab-n1 lab; do
    if (try_lab_env && cd "$TRY_LAB_DIR" && pulumi stack select "$stack" 2>/dev/null); then
      say "destroying stack $stack"
      (try_lab_env && cd "$TRY_LAB_DIR" && "$REPO/scripts/pulumi" destroy --yes --non-interactive --stack "$stack")
    fi
  done
}

# Which tests pytest's arguments select: "all" (no path given), "lab" (a path under tests/e2e or tests/lab), or
# "other".
selected_tests() {
  local arg paths=0 value=0
  for arg in "$@"; do
    if [ $value -eq 1 ]; then value=0; continue; fi
    case $arg in
      -k|-m|-p|-o|-c|--deselect|--ignore|--durations|--maxfail) value=1 ;;  # options whose value is the next word
      -*) ;;
      *tests/e2e*|*tests/lab*) echo lab; return ;;
      *) paths=1 ;;
    esac
  done
  if [ $paths -eq 0 ]; then echo all; else echo other; fi
}
