# Starts `vllm serve` in the background inside the Ray head container; its arguments are this script's, after
# an optional --life=TOKEN, kept in serve.life beside the pid file (components/preflight/liveness.py).
# Secrets arrive in the heredoc below (this script comes over SSH on stdin), never on a command line: one
# `NAME base64(value)` line each. No base64 text can end the heredoc early, whatever the value holds.
set -eu
run=/run/spark-vllm
log=/var/log/spark-vllm/serve.log
mkdir -p "$run" "${log%/*}"
umask 077
life=
case ${1:-} in --life=*) life=${1#--life=}; shift ;; esac
if [ -f "$run/serve.pid" ] && kill -0 "$(cat "$run/serve.pid")" 2>/dev/null; then
  echo "spark-vllm: vllm serve is already running (pid $(cat "$run/serve.pid")); not starting a second one" >&2
  exit 1
fi
# The env file holds NAME='value' lines, single-quoted for `.`. Values reach base64 and sed on stdin, and
# printf and read are builtins: no value is ever an argument of a process.
: > "$run/serve.env"
while read -r name value; do
  [ -n "$name" ] || continue
  decoded=$(printf '%s' "$value" | base64 -d)
  printf "%s='%s'\n" "$name" "$(printf '%s' "$decoded" | sed "s/'/'\\\\''/g")" >> "$run/serve.env"
done <<'SPARK_VLLM_ENV'
@ENV@
SPARK_VLLM_ENV
# The argv, one argument a line, for the watchdog's relaunch (serve_ctl.sh); the previous log kept as serve.log.1.
printf '%s\n' "$@" > "$run/serve.argv"
if [ -n "$life" ]; then echo "$life" > "$run/serve.life"; else rm -f "$run/serve.life"; fi
[ -f "$log" ] && mv -f "$log" "$log.1"
# setsid: the serve gets its own process group, which its delete stops as a whole.
setsid sh -c 'set -a; . "$1"; set +a; shift; exec "$@"' vllm-serve "$run/serve.env" "$@" </dev/null >>"$log" 2>&1 &
echo $! > "$run/serve.pid"
echo "spark-vllm: started vllm serve (pid $!); log $log"
