#!/usr/bin/env bash
# A real SLURM cluster on this one machine, to try hacrl's SLURM launcher (launcher=slurm,
# submitit) on a laptop or a single server, and for CI. Debian/Ubuntu, as root (sudo): slurmd
# starts jobs as their users, and the packages come from apt. No systemd needed.
#
#   bash scripts/local_slurm.sh up       install slurmctld, slurmd, slurm-client and munge if
#                                        missing, write the config, start munged (only if munge
#                                        is not already answering), slurmctld and one slurmd per
#                                        node; wait until every node is idle. Again: "already up".
#   eval "$(bash scripts/local_slurm.sh env)"   SLURM_CONF and PATH (a sacct stand-in first)
#   bash scripts/local_slurm.sh status   one line per daemon, then sinfo (exit 3 if not all up)
#   bash scripts/local_slurm.sh down     cancel the cluster's jobs, stop what `up` started
#
# The cluster: nodes n1..nN on 127.0.0.1 (one slurmd each, own port), partition `local`
# (default), no accounting (so no real sacct: <state>/bin/sacct, from
# scripts/local_slurm_sacct.py, answers submitit's state queries from scontrol). A request
# bigger than a node (e.g. -c 64, paper-scale launcher defaults) is refused at submission.
# Everything lives in the state folder (config, logs, pid files, spool, slurmctld state);
# /etc/slurm is not touched. `down` keeps the folder: logs to read, and job ids go on from
# where they were (submitit folders named by job id are not reused); rm -rf it to start afresh.
# The nodes' CPUs are oversubscribed on purpose: keep jobs small.
#
# Environment (all optional):
#   HACRL_SLURM_DIR          state folder                              [/tmp/hacrl-slurm]
#   HACRL_SLURM_NODES        number of nodes                           [2]
#   HACRL_SLURM_NODE_CPUS    CPUs per node                             [2]
#   HACRL_SLURM_NODE_MEM_MB  memory per node, MB                       [8000]
#   HACRL_SLURM_FAKE_GPUS    fake GPUs per node (gres gpu, /dev/null)  [0]
#   HACRL_SLURM_PORT         slurmctld port; node K listens on PORT+K  [6817]
#   HACRL_SLURM_TIMEOUT      seconds `up` waits for the cluster        [60]
# The settings are read by `up` when nothing runs yet; to change them: down, then up.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${HACRL_SLURM_DIR:-/tmp/hacrl-slurm}"
[[ $dir == /* ]] || dir="$PWD/$dir"
dir="${dir%/}"
nodes="${HACRL_SLURM_NODES:-2}"
cpus="${HACRL_SLURM_NODE_CPUS:-2}"
mem="${HACRL_SLURM_NODE_MEM_MB:-8000}"
gpus="${HACRL_SLURM_FAKE_GPUS:-0}"
port="${HACRL_SLURM_PORT:-6817}"
wait_s="${HACRL_SLURM_TIMEOUT:-60}"
conf="$dir/slurm.conf"
run="$dir/run"
logs="$dir/log"
export SLURM_CONF="$conf"
export PATH="$PATH:/usr/sbin:/sbin"

say() { echo "local SLURM: $*"; }
hint=""  # set once up has started daemons
die() { echo "local SLURM: FAIL: $*$hint" >&2; exit 1; }

for var in nodes cpus mem gpus port wait_s; do
    [[ ${!var} =~ ^[0-9]+$ ]] || die "$var must be a whole number, got '${!var}'"
done
((nodes >= 1 && cpus >= 1 && mem >= 1)) || die "nodes, CPUs and memory must be at least 1"

node_names() { local k; for ((k = 1; k <= nodes; k++)); do echo "n$k"; done; }

# pid_of FILE NAME [ARG]: the pid in FILE, if that process is alive, is NAME and (if given) has
# ARG among its arguments; otherwise fails. Guards against a pid file left by a dead daemon.
pid_of() {
    local file=$1 name=$2 arg=${3:-} pid
    [[ -s $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] && running "$pid" || return 1
    [[ $(<"/proc/$pid/comm") == "$name" ]] || return 1
    if [[ -n $arg ]]; then
        [[ " $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) " == *" $arg "* ]] || return 1
    fi
    echo "$pid"
}
ctld_pid() { pid_of "$run/slurmctld.pid" slurmctld; }
slurmd_pid() { pid_of "$run/slurmd-$1.pid" slurmd "$1"; }
munged_pid() { pid_of "$run/munged.pid" munged; }
munge_ok() { timeout 5 munge -n 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }
ctld_up() { [[ $(timeout 5 scontrol ping 2>/dev/null) == *" is UP"* ]]; }

# tail_log FILE...: the last lines of each file that exists, to stderr
tail_log() {
    local file
    for file in "$@"; do
        [[ -s $file ]] || continue
        echo "---- last lines of $file:" >&2
        tail -n 20 "$file" >&2
    done
}

write_conf() {  # write_conf FILE: the cluster's slurm.conf
    local host k gres=""
    host=$(uname -n)
    host=${host%%.*}
    if ((gpus > 0)); then gres=" Gres=gpu:$gpus"; fi
    {
        echo "# Written by hacrl scripts/local_slurm.sh: a local test cluster, not for production."
        echo "ClusterName=hacrl-local"
        echo "SlurmctldHost=$host(127.0.0.1)"
        echo "SlurmctldPort=$port"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "AuthInfo=cred_expire=5"
        echo "CommunicationParameters=NoInAddrAny"
        echo "MessageTimeout=10"
        echo "StateSaveLocation=$dir/state"
        echo "SlurmdSpoolDir=$dir/spool/%n"
        echo "SlurmctldPidFile=$run/slurmctld.pid"
        echo "SlurmdPidFile=$run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$logs/slurmctld.log"
        echo "SlurmdLogFile=$logs/slurmd-%n.log"
        echo "SlurmdParameters=config_overrides"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "MpiDefault=none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core_Memory"
        echo "DefMemPerCPU=$((mem / cpus))"
        echo "EnforcePartLimits=ALL"
        echo "SchedulerParameters=sched_interval=2,bf_interval=2"
        echo "ReturnToService=2"
        echo "KillWait=15"  # a cancelled job has 15 s to end its runs before SIGKILL
        echo "MinJobAge=600"
        echo "MailProg=/bin/true"
        if ((gpus > 0)); then echo "GresTypes=gpu"; fi
        for ((k = 1; k <= nodes; k++)); do
            echo "NodeName=n$k NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((port + k))" \
                "CPUs=$cpus RealMemory=$mem$gres State=UNKNOWN"
        done
        echo "PartitionName=local Nodes=$(node_names | paste -sd,) Default=YES" \
            "MaxTime=INFINITE State=UP"
    } >"$1"
}

write_gres() {  # gres.conf and the fake GPU devices (links to /dev/null; files are refused)
    local name i files
    rm -f "$dir/gres.conf"
    ((gpus > 0)) || return 0
    echo "AutoDetect=off" >"$dir/gres.conf"
    for name in $(node_names); do
        mkdir -p "$dir/gpu/$name"
        for ((i = 0; i < gpus; i++)); do ln -sfn /dev/null "$dir/gpu/$name/gpu$i"; done
        files="$dir/gpu/$name/gpu[0-$((gpus - 1))]"
        if ((gpus == 1)); then files="$dir/gpu/$name/gpu0"; fi
        echo "NodeName=$name Name=gpu File=$files" >>"$dir/gres.conf"
    done
}

install_packages() {
    local packages=(slurmctld slurmd slurm-client munge) apt_log="$logs/apt.log"
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v sinfo >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    command -v apt-get >/dev/null ||
        die "slurmctld/slurmd/munge missing and no apt-get to install them"
    say "installing ${packages[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${packages[@]}" >"$apt_log" 2>&1; then
        say "install failed; apt-get update, then again"
        { apt-get update && apt-get install -y --no-install-recommends "${packages[@]}"; } \
            >>"$apt_log" 2>&1 ||
            { tail_log "$apt_log"; die "apt-get install ${packages[*]} failed"; }
    fi
}

start_munged() {
    local i
    if munge_ok; then
        if munged_pid >/dev/null; then say "munged: running (started by an earlier up)"
        else say "munged: already answering, using it (down will leave it running)"; fi
        return 0
    fi
    [[ -s /etc/munge/munge.key ]] ||
        die "no /etc/munge/munge.key (reinstall munge, or run mungekey --create as user munge)"
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 0755 /run/munge
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged </dev/null >>"$logs/munged.out" 2>&1 ||
        { tail_log "$logs/munged.out" /var/log/munge/munged.log; die "munged did not start"; }
    for ((i = 0; i < 50; i++)); do
        munge_ok && break
        sleep 0.2
    done
    if ! munge_ok; then
        tail_log "$logs/munged.out" /var/log/munge/munged.log
        die "munged started but munge does not answer"
    fi
    cp /run/munge/munged.pid "$run/munged.pid"  # marks it as ours: down stops it
}

# fail_if_dead: a daemon whose pid file is written but whose process is gone has failed
fail_if_dead() {
    local name
    if [[ -s $run/slurmctld.pid ]] && ! ctld_pid >/dev/null; then
        tail_log "$logs/slurmctld.log" "$logs/slurmctld.out"
        die "slurmctld exited (see $logs/slurmctld.log)"
    fi
    for name in $(node_names); do
        if [[ -s $run/slurmd-$name.pid ]] && ! slurmd_pid "$name" >/dev/null; then
            tail_log "$logs/slurmd-$name.log" "$logs/slurmd-$name.out"
            die "slurmd for $name exited (see $logs/slurmd-$name.log)"
        fi
    done
}

# not_idle: the nodes sinfo does not show as idle (or mix, alloc, comp: up, with jobs)
not_idle() {
    local states name
    states=$(timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null) || { node_names; return; }
    for name in $(node_names); do
        grep -Eq "^$name (idle|mix|alloc|comp)$" <<<"$states" || echo "$name"
    done
}

cmd_up() {
    local t0 name deadline all_up=1 any_up=0 waiting file
    t0=$(date +%s%N)
    ((EUID == 0)) || die "up needs root (slurmd starts jobs as their users): sudo bash $0 up"
    mkdir -p "$dir/bin" "$dir/state" "$run" "$logs"
    install_packages
    if ctld_pid >/dev/null; then any_up=1; else all_up=0; fi
    for name in $(node_names); do slurmd_pid "$name" >/dev/null || all_up=0; done
    for file in "$run"/slurmd-*.pid; do
        name=${file##*/slurmd-}
        if slurmd_pid "${name%.pid}" >/dev/null; then any_up=1; fi
    done
    write_conf "$conf.new"
    if ((any_up)) && [[ -s $conf ]]; then
        # something runs: keep its config (a new one would only apply to half of it)
        if ! cmp -s "$conf" "$conf.new"; then
            say "WARNING: settings differ from the running cluster's; keeping those" \
                "(down, then up, to apply)"
        fi
        rm -f "$conf.new"
    else
        mv "$conf.new" "$conf"
        write_gres
    fi
    chmod 0755 "$dir"
    chmod 0644 "$conf"
    install -m 0755 "$repo/scripts/local_slurm_sacct.py" "$dir/bin/sacct"
    if ((all_up)) && ctld_up && [[ -z $(not_idle) ]] && munge_ok; then
        say "already up ($dir); nodes: $(node_names | paste -sd' ')"
        return 0
    fi
    hint=" (what did start is left running for a look; bash $0 down stops it)"
    start_munged
    if ! ctld_pid >/dev/null; then
        rm -f "$run/slurmctld.pid"
        say "starting slurmctld"
        slurmctld -f "$conf" </dev/null >>"$logs/slurmctld.out" 2>&1 ||
            { tail_log "$logs/slurmctld.log" "$logs/slurmctld.out"; die "slurmctld did not start"; }
    fi
    for name in $(node_names); do
        slurmd_pid "$name" >/dev/null && continue
        rm -f "$run/slurmd-$name.pid"
        mkdir -p "$dir/spool/$name"
        say "starting slurmd -N $name"
        slurmd -N "$name" -f "$conf" </dev/null >>"$logs/slurmd-$name.out" 2>&1 ||
            { tail_log "$logs/slurmd-$name.log" "$logs/slurmd-$name.out"
              die "slurmd -N $name did not start"; }
    done
    deadline=$((SECONDS + wait_s))
    say "waiting (up to $wait_s s) for slurmctld to answer scontrol ping"
    until ctld_up; do
        fail_if_dead
        if ((SECONDS >= deadline)); then
            tail_log "$logs/slurmctld.log" "$logs/slurmctld.out"
            die "slurmctld did not answer scontrol ping within $wait_s s"
        fi
        sleep 0.5
    done
    say "waiting for nodes $(node_names | paste -sd' ') to be idle in sinfo"
    while waiting=$(not_idle) && [[ -n $waiting ]]; do
        fail_if_dead
        if ((SECONDS >= deadline)); then
            timeout 5 sinfo -N -l >&2 || true
            for name in $waiting; do tail_log "$logs/slurmd-$name.log"; done
            tail_log "$logs/slurmctld.log"
            die "node(s) $(paste -sd' ' <<<"$waiting") not idle within $wait_s s"
        fi
        sleep 0.5
    done
    say "up in $(( ($(date +%s%N) - t0) / 1000000 )) ms ($dir); nodes: $(node_names | paste -sd' ')"
    say "use it with: eval \"\$(bash $0 env)\""
}

running() {  # running PID: the process exists and is not a zombie waiting for its reaper
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

# stop NAME=PID...: SIGTERM to all at once (each takes ~2 s to exit), wait up to 15 s, then
# SIGKILL what is left
stop() {
    local item i left=("$@")
    for item in "$@"; do kill -TERM "${item#*=}" 2>/dev/null || true; done
    for ((i = 0; i < 150 && ${#left[@]}; i++)); do
        sleep 0.1
        for item in "${!left[@]}"; do
            if ! running "${left[item]#*=}"; then
                say "stopped ${left[item]%=*} (pid ${left[item]#*=})"
                unset "left[item]"
            fi
        done
    done
    for item in "${left[@]}"; do
        say "${item%=*} (pid ${item#*=}) still there after 15 s: SIGKILL"
        kill -KILL "${item#*=}" 2>/dev/null || true
    done
    for item in "${left[@]}"; do
        for ((i = 0; i < 50; i++)); do running "${item#*=}" || continue 2; sleep 0.1; done
        die "could not stop ${item%=*} (pid ${item#*=})"
    done
}

# kill_tree PID: SIGKILL PID and all its descendants (each stopped first: no new forks)
kill_tree() {
    local child
    kill -STOP "$1" 2>/dev/null || true
    for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
    kill -KILL "$1" 2>/dev/null || true
}

cmd_down() {
    local ids pid file name i env daemons
    if ctld_pid >/dev/null && ctld_up; then
        ids=$(timeout 10 squeue -h -o %A -t PD,R,CG,S,CF,RQ,RS,RH,SI,SO,ST 2>/dev/null |
            sort -u | paste -sd' ' || true)
        if [[ -n $ids ]]; then
            say "cancelling jobs: $ids"
            # shellcheck disable=SC2086  # one argument per job id
            timeout 10 scancel $ids 2>/dev/null || true
            for ((i = 0; i < 60; i++)); do  # wait for their processes to be killed (KillWait=15)
                ids=$(timeout 5 squeue -h -o %A -t R,CG,S,CF,SI,SO 2>/dev/null || true)
                [[ -z $ids ]] && break
                sleep 0.5
            done
        fi
    fi
    daemons=()
    for file in "$run"/slurmd-*.pid; do
        [[ -e $file ]] || continue
        name=${file##*/slurmd-}
        name=${name%.pid}
        if pid=$(slurmd_pid "$name"); then daemons+=("slurmd $name=$pid"); fi
    done
    if pid=$(ctld_pid); then daemons+=("slurmctld=$pid"); fi
    # munged too: none of them needs munge to shut down
    if pid=$(munged_pid); then daemons+=("munged=$pid"); fi
    if ((${#daemons[@]})); then stop "${daemons[@]}"; fi
    rm -f "$run"/slurmd-*.pid "$run/slurmctld.pid" "$run/munged.pid"
    # job steps of this cluster still alive (their slurmd is gone): they carry our SLURM_CONF
    for pid in $(pgrep -x slurmstepd || true); do
        env=$({ tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null || true)
        if grep -qxF "SLURM_CONF=$conf" <<<"$env"; then
            say "WARNING: job step process $pid left over: killing it and its children"
            kill_tree "$pid"
        fi
    done
    say "down ($dir kept: logs, slurmctld state)"
}

cmd_status() {
    local pid name ok=1
    if pid=$(ctld_pid); then
        if ctld_up; then echo "slurmctld    running (pid $pid), answering"
        else echo "slurmctld    running (pid $pid), not answering"; ok=0; fi
    else echo "slurmctld    stopped"; ok=0; fi
    for name in $(node_names); do
        if pid=$(slurmd_pid "$name"); then echo "slurmd $(printf '%-5s' "$name") running (pid $pid)"
        else echo "slurmd $(printf '%-5s' "$name") stopped"; ok=0; fi
    done
    if pid=$(munged_pid); then echo "munged       running (pid $pid, started by up)"
    elif munge_ok; then echo "munged       answering (not started by this script)"
    else echo "munged       not answering"; ok=0; fi
    if ctld_pid >/dev/null; then timeout 10 sinfo || ok=0; fi
    ((ok)) || return 3
}

cmd_env() {
    printf 'export SLURM_CONF=%q\n' "$conf"
    # shellcheck disable=SC2016  # $PATH is for the shell that evaluates these lines
    printf 'export PATH=%q:"$PATH"\n' "$dir/bin"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *)
        echo "usage: bash $0 up|down|status|env   (see the comment at the top of this file)" >&2
        exit 2
        ;;
esac
