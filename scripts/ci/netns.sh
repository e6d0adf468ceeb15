#!/usr/bin/env bash
# Network namespaces for tests: a namespace joined to the root namespace by one veth pair on a
# private /30 that this script owns (10.231.X.0/30: root side .1, namespace side .2). The
# namespace gets no other route, so traffic from inside can reach only the root side's veth
# address. Needs root and iproute2.
#
#   netns.sh check             exit 0 "netns ok", or exit 1 "netns unavailable: REASON" (one line)
#   netns.sh up NAME           create; print NETNS=, NETNS_HOST_IP=, NETNS_NS_IP=, NETNS_HOST_IF=,
#                              NETNS_NS_IF= lines (shell-evaluable); exit 1 with a reason line
#   netns.sh exec NAME CMD...  run CMD inside the namespace
#   netns.sh down NAME         kill what still runs inside, delete the namespace and its veth pair
#   netns.sh gc                take down every namespace made here whose creator is gone
#
# The creator is the caller's pid (or $DDPTUI_NETNS_OWNER): `up` first collects namespaces whose
# creator has died, so a killed test run leaves nothing behind for long.
set -uo pipefail

STATE=/run/ddptui-netns
PREFIX=10.231
OWNER=$PPID

fail() {
  echo "netns unavailable: $*"
  exit 1
}

valid_name() {
  [[ "$1" =~ ^[A-Za-z0-9_-]{1,40}$ ]] || {
    echo "netns.sh: bad namespace name '$1' (letters, digits, _ and -, at most 40)" >&2
    exit 2
  }
}

# The subnet index X recorded for namespace NAME, or nothing.
index_of() {
  local d
  for d in "$STATE"/*/; do
    [ -f "$d/name" ] && [ "$(cat "$d/name")" = "$1" ] && basename "$d" && return 0
  done
  return 1
}

down() {
  local name=$1 x pid i
  x=$(index_of "$name")
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$name"; then
    # Processes still inside would keep the namespace (and its veth pair) alive after `del`.
    for pid in $(ip netns pids "$name" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
    for i in $(seq 20); do
      [ -z "$(ip netns pids "$name" 2>/dev/null)" ] && break
      sleep 0.1
    done
    for pid in $(ip netns pids "$name" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$name" 2>/dev/null
  fi
  if [ -n "$x" ]; then
    ip link del "dt$x-h" 2>/dev/null
    rm -rf "${STATE:?}/$x"
  fi
  return 0
}

gc() {
  local d owner
  for d in "$STATE"/*/; do
    [ -d "$d" ] || continue
    owner=$(cat "$d/owner" 2>/dev/null)
    # A fresh claim has no owner for an instant; its creator is alive by definition.
    [ -z "$owner" ] && continue
    kill -0 "$owner" 2>/dev/null && continue
    if [ -f "$d/name" ]; then
      down "$(cat "$d/name")"
    else
      rm -rf "$d"
    fi
  done
}

check() {
  [ "$(id -u)" = 0 ] || fail "network namespaces need root (running as uid $(id -u))"
  command -v ip >/dev/null || fail "iproute2 ('ip') is not installed"
  local probe="ddptui-probe-$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then
    fail "'ip netns add' failed: $(head -n1 <<<"$err")"
  fi
  if ! err=$(ip link add "dtp$$-h" type veth peer name "dtp$$-n" netns "$probe" 2>&1); then
    ip netns del "$probe" 2>/dev/null
    fail "cannot create a veth pair: $(head -n1 <<<"$err")"
  fi
  ip link del "dtp$$-h" 2>/dev/null
  ip netns del "$probe" 2>/dev/null
  echo "netns ok"
}

# A subnet index no address or route of the root namespace already uses; claimed atomically.
claim_index() {
  local x
  mkdir -p "$STATE"
  for x in $(seq 1 254); do
    ip -o -4 addr show | grep -qF " $PREFIX.$x." && continue
    ip -4 route show | grep -q "^$PREFIX\.$x\." && continue
    ip link show "dt$x-h" >/dev/null 2>&1 && continue
    if mkdir "$STATE/$x" 2>/dev/null; then
      echo "${DDPTUI_NETNS_OWNER:-$OWNER}" >"$STATE/$x/owner"
      echo "$x"
      return 0
    fi
  done
  return 1
}

up() {
  local name=$1 x err host_ip ns_ip
  [ "$(id -u)" = 0 ] || fail "network namespaces need root (running as uid $(id -u))"
  command -v ip >/dev/null || fail "iproute2 ('ip') is not installed"
  gc
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$name"; then
    fail "namespace '$name' already exists"
  fi
  x=$(claim_index) || fail "no free subnet in $PREFIX.0.0/16"
  echo "$name" >"$STATE/$x/name"
  host_ip="$PREFIX.$x.1"
  ns_ip="$PREFIX.$x.2"
  if ! err=$(
    set -e
    ip netns add "$name" 2>&1
    ip -n "$name" link set lo up 2>&1
    ip link add "dt$x-h" type veth peer name "dt$x-n" netns "$name" 2>&1
    ip addr add "$host_ip/30" dev "dt$x-h" 2>&1
    ip link set "dt$x-h" up 2>&1
    ip -n "$name" addr add "$ns_ip/30" dev "dt$x-n" 2>&1
    ip -n "$name" link set "dt$x-n" up 2>&1
  ); then
    down "$name"
    fail "$(tail -n1 <<<"$err")"
  fi
  echo "NETNS=$name"
  echo "NETNS_HOST_IP=$host_ip"
  echo "NETNS_NS_IP=$ns_ip"
  echo "NETNS_HOST_IF=dt$x-h"
  echo "NETNS_NS_IF=dt$x-n"
}

case "${1:-}" in
  check) check ;;
  up)
    [ $# -eq 2 ] || { echo "usage: $0 up NAME" >&2; exit 2; }
    valid_name "$2"
    up "$2"
    ;;
  down)
    [ $# -eq 2 ] || { echo "usage: $0 down NAME" >&2; exit 2; }
    valid_name "$2"
    down "$2"
    ;;
  exec)
    [ $# -ge 3 ] || { echo "usage: $0 exec NAME CMD..." >&2; exit 2; }
    valid_name "$2"
    name=$2
    shift 2
    exec ip netns exec "$name" "$@"
    ;;
  gc) gc ;;
  *)
    echo "usage: $0 check | up NAME | exec NAME CMD... | down NAME | gc" >&2
    exit 2
    ;;
esac
