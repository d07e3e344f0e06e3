# Starts `vllm serve` in the background inside the Ray head container; its arguments are this script's.
# Secrets arrive in the heredoc below (this script comes over SSH on stdin), never on a command line.
set -eu
run=/run/spark-vllm
log=/var/log/spark-vllm/serve.log
mkdir -p "$run" /var/log/spark-vllm
umask 077
if [ -f "$run/serve.pid" ] && kill -0 "$(cat "$run/serve.pid")" 2>/dev/null; then
  echo "spark-vllm: vllm serve is already running (pid $(cat "$run/serve.pid")); not starting a second one" >&2
  exit 1
fi
cat > "$run/serve.env" <<'SPARK_VLLM_ENV'
@ENV@
SPARK_VLLM_ENV
: > "$log"
# setsid: the serve gets its own process group, which its delete stops as a whole.
setsid sh -c 'set -a; . /run/spark-vllm/serve.env; set +a; exec "$@"' vllm-serve "$@" </dev/null >>"$log" 2>&1 &
echo $! > "$run/serve.pid"
echo "spark-vllm: started vllm serve (pid $!); log $log"
