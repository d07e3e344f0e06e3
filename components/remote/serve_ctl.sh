# The `vllm serve` that serve_start.sh started, by its pid file:
#   alive PID_FILE             prints the pid and exits 0 while the process lives
#   stop PID_FILE ENV_FILE     stops its whole process group, TERM first, KILL after 60 s; removes both files
# A missing pid file means there is no serve: `alive` fails, `stop` has nothing to do.
action=$1 pid_file=$2 env_file=${3:-}
p=$(cat "$pid_file" 2>/dev/null) || { [ "$action" = stop ]; exit; }
# A zombie still answers kill -0; nothing reaps it when the container's init is `ray start`.
running() { [ -e "/proc/$p" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$p/status" 2>/dev/null; }
if [ "$action" = alive ]; then
  running && echo "$p"
  exit
fi
kill -TERM "-$p" 2>/dev/null
i=0
while running && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
running && kill -KILL "-$p" 2>/dev/null
rm -f "$pid_file" "$env_file"
exit 0
