# Drops the node's page cache before vLLM starts (spark-vllm:serve.dropPageCache): on a unified-memory GB10 the
# cache holds memory that vLLM's start-up check counts as used. Runs on the node itself, as the SSH user: root
# writes the file, anyone else goes through `sudo -n`, which must not ask for a password.
# Arguments: the node's name [, the file to write: /proc/sys/vm/drop_caches; tests give another].
node=$1 target=${2:-/proc/sys/vm/drop_caches}
cached() { awk '/^Cached:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo; }
before=$(cached)
sync
if [ "$(id -u)" -eq 0 ]; then
  why=$( (echo 1 > "$target") 2>&1 )
else
  why=$(echo 1 | sudo -n tee "$target" 2>&1 >/dev/null)
fi
if [ $? -ne 0 ]; then
  why=$(printf '%s' "$why" | tail -n 1)
  echo "spark-vllm: could not drop the page cache on $node as $(id -un): ${why:-not permitted}. Fix: connect as" \
    "root, or let $(id -un) run \`sudo -n tee $target\` without a password, or set" \
    "spark-vllm:serve.dropPageCache to false" >&2
  exit 1
fi
echo "spark-vllm: dropped the page cache on $node (cached: $before before, $(cached) after)"
