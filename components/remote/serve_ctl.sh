# The `vllm serve` that serve_start.sh started, by its pid file:
#   alive PID_FILE                      prints the pid and exits 0 while the process lives
#   stop PID_FILE ENV_FILE              stops its whole process group, TERM first, KILL after 60 s; removes both
#                                       files and the life token beside the pid file
#   stop-keep PID_FILE ENV_FILE         the same, keeping the env file (the watchdog relaunches with it)
#   relaunch PID_FILE ENV_FILE ARGV_FILE LOG   stop-keep, then the same serve again: the argv serve_start.sh kept
#                                       (one argument a line), the env file, the log rotated
# A missing pid file means there is no serve: `alive` fails, `stop` has nothing to do.
action=$1 pid_file=$2 env_file=${3:-}
# Alive: the process has a state and it is not Z (a zombie still answers kill -0, until Docker's init reaps it).
# One read of its status: a pid reaped between two reads would be counted alive (seen in CI on a busy node).
running() {
  state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$p/status" 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}
stop() {
  kill -TERM "-$p" 2>/dev/null
  kill -CONT "-$p" 2>/dev/null  # a stopped (wedged) process acts on TERM only once continued
  i=0
  while running && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
  running && kill -KILL "-$p" 2>/dev/null
  i=0
  while running && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  ! running
}
if p=$(cat "$pid_file" 2>/dev/null); then
  case $action in
    alive) running && echo "$p"; exit ;;
    stop|stop-keep|relaunch) stop || { echo "spark-vllm: vllm serve (pid $p) did not stop" >&2; exit 1; } ;;
  esac
else
  [ "$action" = alive ] && exit 1
fi
rm -f "$pid_file"
case $action in
  stop) rm -f "$env_file" "${pid_file%.pid}.life" ;;
  relaunch)
    argv_file=$4 log=$5
    set --
    while IFS= read -r arg; do set -- "$@" "$arg"; done < "$argv_file"
    [ -f "$log" ] && mv -f "$log" "$log.1"
    setsid sh -c 'set -a; . "$1"; set +a; shift; exec "$@"' vllm-serve "$env_file" "$@" </dev/null >>"$log" 2>&1 &
    echo $! > "$pid_file"
    echo "spark-vllm: relaunched vllm serve (pid $!); log $log"
    ;;
esac
exit 0
