# Stops the `vllm serve` that serve_start.sh started: its whole process group, TERM first, KILL after 60 s.
# Arguments: the pid file and the env file. A missing pid file means there is nothing to stop.
pid_file=$1 env_file=$2
p=$(cat "$pid_file" 2>/dev/null) || exit 0
# A zombie still answers kill -0; nothing reaps it when the container's init is `ray start`.
running() { [ -e "/proc/$p" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$p/status" 2>/dev/null; }
kill -TERM "-$p" 2>/dev/null
i=0
while running && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
running && kill -KILL "-$p" 2>/dev/null
rm -f "$pid_file" "$env_file"
exit 0
