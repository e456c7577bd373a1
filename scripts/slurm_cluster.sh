#!/usr/bin/env bash
# A real 4-node Slurm cluster on this one machine, for tests, CI and trying launcher=slurm locally:
# Debian's slurm-wlm, slurmctld plus four slurmd started with `slurmd -N nodeK`, every node at
# NodeAddr=127.0.0.1 on its own port, auth/none, proctrack/linuxproc, task/none, and a job-completion
# log (no slurmdbd). Needs root (slurmd runs jobs as their user).
#
#   scripts/slurm_cluster.sh start     # installs slurm-wlm if missing, starts, waits for 4 nodes to answer;
#                                      # a cluster already up and healthy is left running, its jobs with it
#   scripts/slurm_cluster.sh restart   # the clean start: stops it, forgets every job and node state
#   scripts/slurm_cluster.sh status
#   scripts/slurm_cluster.sh stop
#
# Then: export SLURM_CONF=$FSDPBENCH_SLURM_DIR/slurm.conf   (printed by start)
#       python -m bench.sweep +sweep=smoke cluster=slurm_local launcher=slurm
set -euo pipefail

DIR="${FSDPBENCH_SLURM_DIR:-/tmp/fsdpbench-slurm}"
NODES="${FSDPBENCH_SLURM_NODES:-4}"
CPUS="${FSDPBENCH_SLURM_CPUS:-$(nproc)}"  # per node; every node shares this machine's cores
CTLD_PORT="${FSDPBENCH_SLURM_PORT:-16817}"
CONF="$DIR/slurm.conf"

install() {
    command -v slurmctld >/dev/null && return
    echo "installing slurm-wlm (Debian) ..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm >/dev/null
}

conf_text() {
    cat <<EOF
ClusterName=fsdpbench
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
# a requeued job (NODE_FAIL) waits cred_expire seconds before it may start again (slurm.conf(5), AuthInfo;
# default 120 s, least 5): a real cluster's wait, shortened for a test cluster whose runs last seconds
AuthInfo=cred_expire=30
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/state/slurmd.%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
SchedulerType=sched/backfill
# backfill every second (default 30 s): this cluster's runs last seconds where a real study's last tens of
# minutes; launcher.slurm.admission=slurm leaves the packing to it (benchmarks/schedule_slurm.py --compare)
SchedulerParameters=bf_interval=1
SlurmdParameters=config_overrides
TaskProlog=$DIR/taskprolog.sh
EOF
    for k in $(seq 1 "$NODES"); do
        echo "NodeName=node$k NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=$((CTLD_PORT + k)) CPUs=$CPUS State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
}

write_conf() {
    mkdir -p "$DIR/state" "$DIR/log"
    conf_text >"$CONF"
    # Each node's own environment, from outside any job: the lines of $DIR/env.<node> ("export NAME=value"),
    # which slurmd sets in every task it starts there (tests give one node what a real machine might have:
    # another library path, a plugin that does not load)
    cat >"$DIR/taskprolog.sh" <<EOF
#!/bin/sh
[ -f "$DIR/env.\$SLURMD_NODENAME" ] && cat "$DIR/env.\$SLURMD_NODENAME"
exit 0
EOF
    chmod +x "$DIR/taskprolog.sh"
}

stop() {
    for pidfile in "$DIR"/slurmd.*.pid "$DIR"/slurmctld.pid; do
        [ -f "$pidfile" ] || continue
        kill "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
    done
    pkill -f "slurmd -f $CONF" 2>/dev/null || true
    pkill -f "slurmctld -f $CONF" 2>/dev/null || true
    for _ in $(seq 1 30); do
        pgrep -f "slurm(ctl)?d -f $CONF" >/dev/null || return 0
        sleep 0.5
    done
    pkill -9 -f "slurm(ctl)?d -f $CONF" 2>/dev/null || true
}

alive() {  # alive PIDFILE: its process runs
    [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

controller_up() {  # our slurmctld runs and answers
    alive "$DIR/slurmctld.pid" && SLURM_CONF="$CONF" scontrol ping 2>/dev/null | grep -q "is UP"
}

answering() {  # nodes the controller has answering: idle, or running jobs (allocated, mixed, completing)
    SLURM_CONF="$CONF" sinfo -h -N -o "%N %t" 2>/dev/null | awk '$2 ~ /^(idle|alloc|mix|comp)$/ {print $1}' |
        sort -u | wc -l
}

wait_up() {  # wait_up WHAT: until every node answers, resuming the ones Slurm holds down
    for _ in $(seq 1 60); do
        if [ "$(answering)" -ge "$NODES" ]; then
            echo "slurm cluster $1: $NODES nodes answering"
            echo "export SLURM_CONF=$CONF"
            return 0
        fi
        SLURM_CONF="$CONF" scontrol update nodename="node[1-$NODES]" state=resume 2>/dev/null || true
        sleep 1
    done
    echo "slurm cluster did not come up; logs in $DIR/log" >&2
    tail -n 20 "$DIR"/log/*.log >&2 || true
    return 1
}

restart() {  # the clean start: no jobs, job ids or node states from an earlier run
    install
    stop
    rm -rf "$DIR/state"
    write_conf
    : >"$DIR/log/jobcomp.log"  # job ids restart with a clean controller
    export SLURM_CONF="$CONF"
    slurmctld -f "$CONF" -c
    for k in $(seq 1 "$NODES"); do
        slurmd -f "$CONF" -N "node$k"
    done
    wait_up "up (clean start)"
}

start() {  # idempotent: a controller already up keeps its jobs; only a node daemon that is gone starts again
    install
    if ! controller_up; then
        restart
        return
    fi
    if [ "$(conf_text)" != "$(cat "$CONF")" ]; then
        echo "note: the running cluster's $CONF differs from this script's; \`$0 restart\` applies it" \
            "(and drops every job)" >&2
    fi
    local started=0
    for k in $(seq 1 "$NODES"); do
        if ! alive "$DIR/slurmd.node$k.pid"; then
            SLURM_CONF="$CONF" slurmd -f "$CONF" -N "node$k"
            started=$((started + 1))
        fi
    done
    if [ "$started" -eq 0 ] && [ "$(answering)" -ge "$NODES" ]; then
        echo "slurm cluster already up and healthy: left running, with its jobs"
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    wait_up "already up: $started node daemon(s) started again, jobs kept"
}

case "${1:-}" in
    start) start ;;
    restart) restart ;;
    stop) stop; echo "stopped" ;;
    status) SLURM_CONF="$CONF" sinfo -N ;;
    *) echo "usage: $0 start|restart|stop|status" >&2; exit 2 ;;
esac
