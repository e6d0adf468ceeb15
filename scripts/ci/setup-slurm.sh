#!/usr/bin/env bash
# Bring up a real single-host Slurm (munge + slurmctld + slurmd) from Debian's packages, for the
# tests marked `slurm`. Run as root; idempotent; no systemd needed (daemons are started directly).
#
#   bash scripts/ci/setup-slurm.sh         install if missing, configure, start, wait for the node
#   bash scripts/ci/setup-slurm.sh stop    stop slurmctld, slurmd and munged again
#
# Last line on stdout: "slurm up: NODE CPUS STATE" (exit 0) or "slurm unavailable: REASON"
# (exit 1), so a caller can skip tests with that reason. Progress goes to stderr; apt's output
# goes to $LOG_DIR/apt.log. Takes a tenth of a second when Slurm is already up.
#
# The cluster is one node (this host's `hostname -s`, CPUs = nproc) with one partition `debug`,
# cgroup-free (proctrack/linuxproc, task/none) so it works inside containers, select/cons_tres.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm-env.sh
source "$HERE/slurm-env.sh"

CONF_DIR=$(dirname "$DDPTUI_SLURM_CONF")
MARKER="# Written by ddptui scripts/ci/setup-slurm.sh"
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_KEY=/etc/munge/munge.key
MUNGE_PID=/run/munge/munged.pid
START=$SECONDS

say() { echo "setup-slurm: $* ($((SECONDS - START)) s)" >&2; }
fail() {
  echo "slurm unavailable: $*"
  exit 1
}

# pid_alive PIDFILE NAME: the pid in PIDFILE is a running process called NAME.
pid_alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}

# Last error-looking line of a log file, for a one-line reason.
last_error() {
  # (mpi/pmix complains on every start without PMIx installed; it is harmless with MpiDefault=none)
  grep -iE 'error|fatal' "$1" 2>/dev/null | grep -v pmix | tail -n1 | cut -c1-200
}

# any_alive PID...: one of them is still running.
any_alive() {
  local pid
  for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}

stop_all() {
  local slurm_pids=() munge_pids=()
  pid_alive "$SLURMD_PID" slurmd && slurm_pids+=("$(cat "$SLURMD_PID")")
  pid_alive "$CTLD_PID" slurmctld && slurm_pids+=("$(cat "$CTLD_PID")")
  pid_alive "$MUNGE_PID" munged && munge_pids+=("$(cat "$MUNGE_PID")")
  # "scontrol shutdown" stops slurmctld and slurmd; SIGTERM whatever is left after 10 s.
  if pid_alive "$CTLD_PID" slurmctld; then
    timeout 10 scontrol shutdown >/dev/null 2>&1
  fi
  for _ in $(seq 50); do any_alive "${slurm_pids[@]}" || break; sleep 0.2; done
  for pid in "${slurm_pids[@]}" "${munge_pids[@]}"; do any_alive "$pid" && kill -TERM "$pid"; done
  for _ in $(seq 50); do any_alive "${slurm_pids[@]}" "${munge_pids[@]}" || break; sleep 0.2; done
  any_alive "${slurm_pids[@]}" "${munge_pids[@]}" && fail "could not stop the daemons"
  echo "slurm stopped"
}

if [ "${1:-}" = stop ]; then
  stop_all
  exit 0
elif [ $# -gt 0 ]; then
  echo "usage: $0 [stop]" >&2
  exit 2
fi

# Already up: nothing to do.
if status=$(ddptui_slurm_status); then
  echo "$status"
  exit 0
fi

[ "$(id -u)" = 0 ] || fail "setup needs root (running as uid $(id -u)); $status"

# One setup at a time (two test sessions may ask at once); the winner may have done it all.
# The daemons must not inherit fd 9, or they would hold the lock for good.
exec 9>/run/ddptui-setup-slurm.lock
flock -w 200 9 || fail "another setup-slurm.sh holds /run/ddptui-setup-slurm.lock"
if status=$(ddptui_slurm_status); then
  echo "$status"
  exit 0
fi

# 1. Packages.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
  || ! command -v srun >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || fail "Slurm is not installed and there is no apt-get"
  mkdir -p "$LOG_DIR"
  export DEBIAN_FRONTEND=noninteractive
  say "apt-get update"
  # A source that cannot be reached makes update fail while the install may still work.
  timeout 60 apt-get update -q >"$LOG_DIR/apt.log" 2>&1 \
    || say "apt-get update failed, trying the install anyway: $(tail -n1 "$LOG_DIR/apt.log")"
  say "apt-get install slurm-wlm munge"
  timeout 100 apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=30 \
    slurm-wlm munge >>"$LOG_DIR/apt.log" 2>&1 \
    || fail "apt-get install slurm-wlm munge failed: $(tail -n1 "$LOG_DIR/apt.log")"
fi

# 2. Munge: a key and a running munged.
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
if id munge >/dev/null 2>&1; then
  MUNGE_USER=munge
else
  MUNGE_USER=root
fi
if [ ! -s "$MUNGE_KEY" ]; then
  say "creating the munge key"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile="$MUNGE_KEY" --force >/dev/null 2>&1
  fi
  [ -s "$MUNGE_KEY" ] || dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
fi
chown "$MUNGE_USER:$MUNGE_USER" "$MUNGE_KEY" /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 0400 "$MUNGE_KEY"
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
if ! pid_alive "$MUNGE_PID" munged; then
  say "starting munged"
  runuser -u "$MUNGE_USER" -- munged --force >/dev/null 2>&1 9>&-
fi
munge_ok=0
for _ in $(seq 25); do
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    munge_ok=1
    break
  fi
  sleep 0.2
done
[ "$munge_ok" = 1 ] || fail "munged does not work: $(last_error /var/log/munge/munged.log)"

# 3. slurm.conf for this host (never replaces a configuration this script did not write).
node=$(hostname -s)
cpus=$(nproc)
mem_mb=$(awk '/^MemTotal:/{print int($2 / 1024)}' /proc/meminfo)
real_mem=$((mem_mb - mem_mb / 20 - 256))
[ "$real_mem" -ge 256 ] || real_mem=256
if [ -e "$DDPTUI_SLURM_CONF" ] && ! grep -qF "$MARKER" "$DDPTUI_SLURM_CONF"; then
  fail "$DDPTUI_SLURM_CONF exists and was not written by this script; not replacing it"
fi
mkdir -p "$CONF_DIR" "$LOG_DIR" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd"
cat >"$DDPTUI_SLURM_CONF.new" <<CONF
$MARKER: a one-node test cluster.
ClusterName=$DDPTUI_SLURM_CLUSTER
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No cgroups: works inside containers.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# The node's real layout may differ from CPUs= below (VMs, affinity); use ours, never drain.
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
StateSaveLocation=$STATE_DIR/slurmctld
SlurmdSpoolDir=$STATE_DIR/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$real_mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
mv "$DDPTUI_SLURM_CONF.new" "$DDPTUI_SLURM_CONF"
# Slurm 24.05+ can switch its cgroup layer off outright; older releases do not know "disabled".
version=$(slurmd -V 2>/dev/null | awk '{print $2}')
if printf '%s\n' 24.05 "$version" | sort -V -C; then
  printf '%s\nCgroupPlugin=disabled\n' "$MARKER" >"$CONF_DIR/cgroup.conf"
fi

# 4. Daemons.
if ! pid_alive "$CTLD_PID" slurmctld; then
  say "starting slurmctld (slurm $version)"
  slurmctld >/dev/null 2>&1 9>&- \
    || fail "slurmctld did not start: $(last_error "$LOG_DIR/slurmctld.log")"
fi
started=$SECONDS
until timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; do
  # It daemonizes before it binds its port: a fatal error shows as the daemon gone (once it
  # had a few seconds to write its pid file).
  sleep 0.5
  if [ $((SECONDS - started)) -ge 30 ] \
    || { [ $((SECONDS - started)) -ge 3 ] && ! pid_alive "$CTLD_PID" slurmctld; }; then
    fail "slurmctld does not answer: $(last_error "$LOG_DIR/slurmctld.log")"
  fi
done
if ! pid_alive "$SLURMD_PID" slurmd; then
  say "starting slurmd"
  slurmd >/dev/null 2>&1 9>&- || fail "slurmd did not start: $(last_error "$LOG_DIR/slurmd.log")"
fi

# 5. Wait for the node to be idle (resume it once if an earlier run left it down or drained).
resumed=0
for _ in $(seq 150); do
  state=$(timeout 5 sinfo -h -N -n "$node" -o '%t' 2>/dev/null | head -n1)
  case "$state" in
    idle | mix | alloc) break ;;
    down* | drain* | drng* | fail*)
      if [ "$resumed" = 0 ]; then
        timeout 5 scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1
        resumed=1
      fi
      ;;
  esac
  sleep 0.2
done
if status=$(ddptui_slurm_status); then
  say "ready"
  echo "$status"
  exit 0
fi
reason=$(timeout 5 sinfo -h -N -n "$node" -o '%E' 2>/dev/null | head -n1)
fail "${status#slurm unavailable: }${reason:+ (reason: $reason)};" \
  "$(last_error "$LOG_DIR/slurmd.log")"
