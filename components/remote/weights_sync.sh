# Copies the weights a node lacks, or holds in another size (or, by checksum, other contents), from the node that
# has them (the head, or the Hub download's node) to that node over the fabric, with rsync over ssh
# (spark-vllm:preflight.syncWeights); then checks with a dry run that the node holds every file of the source in its
# size, and fails naming the files otherwise. Runs on the source, sent over SSH on stdin. The SSH key arrives
# base64-encoded in this text (no key can end it early), never on a command line; it lives in a 0600 file in a
# private temp folder that is removed on exit.
# Arguments: source target fabric_ip path timeout_s rsync-argv... (components/nodes/node_runner.py's rsync_argv,
# whose ssh reads the key and known_hosts from $SPARK_VLLM_SSH_DIR)
set -u
head=$1 worker=$2 ip=$3 path=$4 limit=$5
shift 5
rsync=$1
shift
umask 077
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' HUP INT TERM
printf '%s' '@KEY@' | base64 -d > "$tmp/key" || exit 1
export SPARK_VLLM_SSH_DIR="$tmp"
case " $* " in
  *" --checksum "*) by="size and SHA-256 (rsync --checksum)" ;;
  *" --size-only "*) by="size" ;;
  *) by="size and modification time" ;;
esac
echo "spark-vllm: syncing $head:$path/ to $worker ($ip) over the fabric; files compared by $by"
start=$(date +%s.%N)
# Sizes as preflight prints them (components/text.py), for both awk programs below.
human='
  function human(n) {
    if (n >= 1073741824) return sprintf("%.1f GiB", n / 1073741824)
    if (n >= 1048576) return sprintf("%.1f MiB", n / 1048576)
    if (n >= 1024) return sprintf("%.1f KiB", n / 1024)
    return n " B"
  }'
# rsync's progress2 line is rewritten in place with \r: each update becomes a line, of which one is kept at each
# finished file and at every GiB. (Its percentage is of every file, copied or not, so it is left out.)
{
  timeout -k 10 "$limit" "$rsync" --info=progress2 --out-format='SPARK_VLLM_FILE %l %n' "$@" </dev/null 2>&1
  echo $? > "$tmp/rc"
} | tr '\r' '\n' | awk -v sum="$tmp/sum" "$human"'
  /^SPARK_VLLM_FILE / {
    name = $0; sub(/^SPARK_VLLM_FILE [0-9]+ /, "", name)
    if (name ~ /\/$/) next
    files++; bytes += $2
    printf "spark-vllm: copying %s (%s)\n", name, human($2); fflush(); next
  }
  /^ *[0-9,]+ +[0-9]+% / {
    copied = $1; gsub(/,/, "", copied); copied += 0
    finished = done; if (match($0, /xfr#[0-9]+/)) finished = substr($0, RSTART + 4, RLENGTH - 4) + 0
    if (copied >= shown + 1073741824 || finished > done) {
      shown = copied; done = finished
      printf "spark-vllm: %s copied, %d file%s done, at %s, %s elapsed\n", human(copied), done, done == 1 ? "" : "s", $3, $4
      fflush()
    }
    next
  }
  NF { print; fflush() }
  END { printf "%d %d\n", files, bytes > sum }'
end=$(date +%s.%N)
rc=$(cat "$tmp/rc" 2>/dev/null || echo 1)
files=0 bytes=0
[ -f "$tmp/sum" ] && read -r files bytes < "$tmp/sum"
case $rc in
  0) ;;
  124 | 137)
    echo "spark-vllm: the sync from $head to $worker did not finish within $limit s" \
      "(spark-vllm:preflight.syncTimeoutSeconds); the files it finished stay, and the next pulumi up copies the rest" >&2
    exit 1 ;;
  *)
    echo "spark-vllm: rsync from $head to $worker ($ip) failed with status $rc; its messages are above" >&2
    exit 1 ;;
esac
# What the copy left (links followed, as the copy follows them): the same rsync as a dry run names every file it would
# still send. After --checksum by size and time, which the copy set too: a checksum would read every byte again.
count=$#
for arg; do
  [ "$arg" = --checksum ] && continue
  set -- "$@" "$arg"
done
shift "$count"
left=$(timeout -k 10 "$limit" "$rsync" --dry-run --out-format='SPARK_VLLM_LEFT %n' "$@" </dev/null 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  printf '%s\n' "$left" >&2
  echo "spark-vllm: the check of $worker's weights against $head's failed with status $rc; its messages are above" >&2
  exit 1
fi
short=$(printf '%s\n' "$left" | sed -n 's/^SPARK_VLLM_LEFT //p' | grep -v '/$' | head -5 | paste -sd, - | sed 's/,/, /g')
if [ -n "$short" ]; then
  echo "spark-vllm: after the sync, $worker still lacks or holds in another size: $short; run pulumi up again" >&2
  exit 1
fi
awk -v s="$start" -v e="$end" -v files="$files" -v bytes="$bytes" -v head="$head" -v worker="$worker" -v by="$by" \
  "$human"' BEGIN {
  t = e - s; if (t < 0.001) t = 0.001
  if (files == 0) {
    printf "spark-vllm: nothing to copy: %s already had every file of %s, the same by %s (checked in %.1f s)\n",
      worker, head, by, t
  } else {
    printf "spark-vllm: synced %d file%s, %s, from %s to %s in %.1f s: %.2f GB/s\n",
      files, files == 1 ? "" : "s", human(bytes), head, worker, t, bytes / 1e9 / t
  }
}'
