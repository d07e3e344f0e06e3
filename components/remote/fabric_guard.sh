# The fabric guard: an iptables chain, hooked first into INPUT, that resets new TCP connections to Ray's ports
# unless they arrive on loopback or the fabric interface. Ray binds most of its ports on 0.0.0.0 and has no auth.
# PORT "ephemeral" is this node's ip_local_port_range, where random listening ports come from; only SYNs are
# refused, so replies to the node's own outgoing connections (which use those ports) still arrive.
#   sh -c "$(cat fabric_guard.sh)" fabric-guard apply CHAIN IFACE LABEL PORT...  (idempotent: rebuilds the chain)
#   sh -c "$(cat fabric_guard.sh)" fabric-guard list PREFIX [LABEL]  the IPv4 chains hooked into INPUT named
#        PREFIX*; with LABEL, only those named PREFIX and 8 hex digits whose rules carry LABEL: a stack's own, not
#        those of a stack whose name starts the same (preflight, scripts/status; the keeper asks for its one chain)
#   sh -c "$(cat fabric_guard.sh)" fabric-guard remove CHAIN
# Needs root; IPv6 gets the same rules where ip6tables exists. The chain's name carries a hash of its rules.
set -eu
action=$1 chain=$2
shift 2
if [ "$action" = apply ]; then
  iface=$1 label=$2
  shift 2
elif [ "$action" = list ]; then
  label=${1:-}
fi
if ! command -v iptables >/dev/null 2>&1; then
  echo "fabric guard: iptables is not installed on $(hostname); install it or set ray.fabricGuard: false" >&2
  exit 3
fi
if [ "$action" = list ]; then
  if [ -z "$label" ]; then
    iptables -w -S INPUT | sed -n "s/^-A INPUT -j \($chain[^ ]*\)\$/\1/p"
    exit
  fi
  for hooked in $(iptables -w -S INPUT | sed -n "s/^-A INPUT -j \($chain[0-9a-f]\{8\}\)\$/\1/p"); do
    if iptables -w -S "$hooked" | grep -qF -- "--comment \"$label\""; then echo "$hooked"; fi
  done
  exit
fi
tables=iptables
if command -v ip6tables >/dev/null 2>&1 && ip6tables -w -S INPUT >/dev/null 2>&1; then
  tables="iptables ip6tables"
fi
for t in $tables; do
  case $action in
    apply)
      $t -w -N "$chain" 2>/dev/null || $t -w -F "$chain"
      $t -w -A "$chain" -i lo -m comment --comment "$label" -j RETURN
      $t -w -A "$chain" -i "$iface" -j RETURN
      for port in "$@"; do
        [ "$port" = ephemeral ] && port=$(tr -s '[:space:]' : < /proc/sys/net/ipv4/ip_local_port_range | sed 's/:$//')
        $t -w -A "$chain" -p tcp --syn --dport "$port" -j REJECT --reject-with tcp-reset
      done
      $t -w -C INPUT -j "$chain" 2>/dev/null || $t -w -I INPUT 1 -j "$chain"
      ;;
    remove)
      while $t -w -D INPUT -j "$chain" 2>/dev/null; do :; done
      $t -w -F "$chain" 2>/dev/null || true
      $t -w -X "$chain" 2>/dev/null || true
      ;;
    *)
      echo "fabric guard: unknown action $action" >&2
      exit 2
      ;;
  esac
done
