#!/usr/bin/env bash
# Is ddptui's single-host test Slurm (scripts/ci/setup-slurm.sh) up and usable?
#
#   bash scripts/ci/slurm-env.sh        exit 0 and print "slurm up: NODE CPUS STATE", or exit 1
#                                       and print "slurm unavailable: REASON" (one line, stdout)
#   source scripts/ci/slurm-env.sh      defines ddptui_slurm_status and the names below
#
# "Usable" means: the Slurm client tools exist, slurmctld answers, the cluster is the test
# cluster this repo set up (never somebody's real cluster), and this host's node is idle, mixed
# or allocated (so jobs can run on it).

DDPTUI_SLURM_CLUSTER=ddptui-test
DDPTUI_SLURM_CONF=/etc/slurm/slurm.conf

# Prints one line and returns 0 when Slurm is usable, 1 otherwise.
ddptui_slurm_status() {
  local node ping cluster state cpus
  node=$(hostname -s)
  if ! command -v sinfo >/dev/null 2>&1 || ! command -v scontrol >/dev/null 2>&1; then
    echo "slurm unavailable: Slurm client tools are not installed (no sinfo/scontrol)"
    return 1
  fi
  ping=$(timeout 10 scontrol ping 2>&1)
  if ! grep -q 'is UP' <<<"$ping"; then
    echo "slurm unavailable: slurmctld does not answer: $(head -n1 <<<"$ping" | cut -c1-160)"
    return 1
  fi
  cluster=$(timeout 10 scontrol show config 2>/dev/null | awk -F' = ' '/^ClusterName/{print $2}')
  if [ "$cluster" != "$DDPTUI_SLURM_CLUSTER" ]; then
    echo "slurm unavailable: cluster '${cluster}' is not the test cluster '$DDPTUI_SLURM_CLUSTER'" \
      "(scripts/ci/setup-slurm.sh makes it)"
    return 1
  fi
  state=$(timeout 10 sinfo -h -N -n "$node" -o '%t' 2>&1 | head -n1)
  cpus=$(timeout 10 sinfo -h -N -n "$node" -o '%c' 2>/dev/null | head -n1)
  case "$state" in
    idle | mix | alloc | comp) echo "slurm up: $node ${cpus:-?} $state" ;;
    *)
      echo "slurm unavailable: node '$node' is in state '${state:-unknown}'"
      return 1
      ;;
  esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  ddptui_slurm_status
fi
