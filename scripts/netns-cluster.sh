#!/usr/bin/env bash
# A cluster of N "nodes" inside this one machine, for multi-node tests.
#
# Each node is a network namespace with its own address and interface
# (eth0, 10.250.0.<k+1>/24), a UTS namespace with its own host name
# (<id>-node<k>) and a private mount namespace whose /dev/shm is a fresh
# tmpfs (so no shared-memory segment crosses nodes: ranks on different nodes
# can only talk over the network) and whose /etc/hosts names every node.
# The nodes hang off a bridge that lives in a namespace of its own
# (<id>-sw), so nothing of the cluster touches this machine's own network:
# no interface, route or address is added to the root namespace. Links can
# be shaped with tc (tbf or htb) to a bandwidth, per direction.
#
# `ip netns exec` alone gives a network namespace but not a host name (it
# makes a throw-away mount namespace per command and no UTS namespace), so
# each node keeps one holder process (sleep, started by unshare inside the
# node's network namespace) whose UTS and mount namespaces every command of
# that node enters with nsenter. Persistent namespace files (unshare
# --uts=FILE) were the other way; they cannot be entered from inside another
# node's private mount namespace, which mpirun's rsh agent needs.
#
# usage:
#   netns-cluster.sh check                 exit 0 if a cluster can be made here, else print
#                                          "skipped: <why>" and exit 77
#   netns-cluster.sh up N [--rate R] [--shaper tbf|htb]
#                                          make N nodes (R: a tc rate such as 1gbit, 200mbit)
#   netns-cluster.sh shape R|none [--shaper tbf|htb]
#   netns-cluster.sh exec NODE CMD...      run CMD on NODE (its index, host name or namespace)
#   netns-cluster.sh rsh [opts] HOST CMD   mpirun's rsh agent: run the shell command CMD on HOST
#   netns-cluster.sh mpirun ARGS...        mpirun on node 0 over every node (host file, rsh agent,
#                                          TCP restricted to the cluster's subnet)
#   netns-cluster.sh slurm-check           exit 0 if SLURM can run on the cluster here, else print
#                                          "skipped: <why>" and exit 77
#   netns-cluster.sh slurm-up              SLURM on the cluster (Debian's slurm-wlm): munged with a key of
#                                          its own, slurmctld on node 0, slurmd on every node; returns when
#                                          every node is idle
#   netns-cluster.sh slurm CMD...          a SLURM command (srun, sbatch, salloc, sinfo, scancel) on node 0,
#                                          with the cluster's SLURM_CONF
#   netns-cluster.sh bytes NODE            "rx_bytes tx_bytes" of NODE's eth0
#   netns-cluster.sh hosts | hostfile | status
#   netns-cluster.sh down                  remove everything (processes first); idempotent
#   netns-cluster.sh run N [--rate R] -- CMD...
#                                          up, CMD here (LK_NETNS_ID exported), down on any exit
#
# Environment: LK_NETNS_ID names the cluster (default lkc; several clusters
# with different ids can coexist), LK_NETNS_SHM_SIZE sizes each node's
# /dev/shm (default 1g). Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), ip,
# unshare, nsenter and a kernel with veth and bridge; tc only for shaping.
set -u
ID=${LK_NETNS_ID:-lkc}
STATE=/run/lk-netns/$ID
SW=$ID-sw
SUBNET_PREFIX=10.250.0
SELF=$(readlink -f "$0")
RUN_CHILD="" # the command of `run`, stopped by its trap

die() { echo "netns-cluster: $*" >&2; exit 1; }
ns_of() { echo "$ID-n$1"; }
host_of() { echo "$ID-node$1"; }
nnodes() { cat "$STATE/nodes" 2>/dev/null || echo 0; }

# NODE (index, host name or namespace name) -> index
node_index() {
  local n; n=$(nnodes)
  case "$1" in
    ''|*[!0-9]*) ;;
    *) [ "$1" -lt "$n" ] && { echo "$1"; return 0; } ;;
  esac
  local k
  for ((k = 0; k < n; k++)); do
    if [ "$1" = "$(host_of $k)" ] || [ "$1" = "$(ns_of $k)" ] || [ "$1" = "$SUBNET_PREFIX.$((k + 1))" ]; then
      echo "$k"; return 0
    fi
  done
  echo "netns-cluster: unknown node '$1' in cluster '$ID' ($n nodes: $(hosts_list))" >&2
  return 1
}
hosts_list() { local k s=""; for ((k = 0; k < $(nnodes); k++)); do s="$s${s:+ }$(host_of $k)"; done; echo "$s"; }

# Why a cluster cannot be made here (empty: it can). Tries the real thing
# with a scratch namespace, since capabilities inside containers vary.
why_not() {
  [ "$(id -u)" = 0 ] || { echo "not root (namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"; return; }
  local t
  for t in ip unshare nsenter; do command -v $t >/dev/null || { echo "$t is not installed"; return; }; done
  local probe=lkprobe-$$
  ip netns add $probe 2>/dev/null || { echo "ip netns add fails (no CAP_SYS_ADMIN/CAP_NET_ADMIN, or /run/netns not writable)"; return; }
  local why=""
  if ! ip -n $probe link add p0 type veth peer name p1 2>/dev/null; then why="cannot create a veth pair (no veth support or CAP_NET_ADMIN)"
  elif ! ip -n $probe link add b0 type bridge 2>/dev/null; then why="cannot create a bridge"
  elif ! ip netns exec $probe unshare --uts --mount --propagation private sh -c \
      'hostname lkprobe && mount -t tmpfs -o size=1m lkprobe /dev/shm' 2>/dev/null; then
    why="cannot make UTS and mount namespaces with a private /dev/shm (unshare --uts --mount)"
  fi
  ip netns del $probe 2>/dev/null
  echo "$why"
}

cmd_check() {
  local why; why=$(why_not)
  [ -z "$why" ] && return 0
  echo "skipped: $why"
  exit 77
}

# tc on both ends of every node's link: egress of the node's eth0 (node ->
# switch) and of the switch port (switch -> node), so each direction of a
# link runs at RATE. burst covers one 64 KiB GSO segment (veth hands tc
# whole segments) and a few ms of traffic, or tbf would drop them.
apply_shape() { # rate shaper
  local rate=$1 shaper=$2 k n; n=$(nnodes)
  for ((k = 0; k < n; k++)); do
    local dev ns
    for pair in "$(ns_of $k) eth0" "$SW p$k"; do
      read -r ns dev <<<"$pair"
      tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null
      [ "$rate" = none ] && continue
      case $shaper in
        tbf) tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 200ms || return 1 ;;
        htb)
          tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 10 &&
            tc -n "$ns" class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" burst 256kb cburst 256kb ||
            return 1 ;;
        *) die "unknown shaper '$shaper' (tbf or htb)" ;;
      esac
    done
  done
  echo "$rate $shaper" >"$STATE/rate"
}

cmd_up() {
  local n=${1:-}; shift || true
  local rate=none shaper=tbf
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --shaper) shaper=$2; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  case "$n" in ''|*[!0-9]*) die "up: expected a node count 1..200, got '$n'" ;; esac
  [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up: expected a node count 1..200, got '$n'"
  [ -e "$STATE" ] && die "cluster '$ID' exists already ($STATE); '$0 down' first or set LK_NETNS_ID"
  local why; why=$(why_not)
  [ -z "$why" ] || die "cannot make namespaces here: $why"
  # From here on a failure undoes everything made so far.
  trap 'cmd_down >/dev/null 2>&1' EXIT
  trap 'exit 130' INT TERM HUP
  mkdir -p "$STATE" || exit 1
  echo "$n" >"$STATE/nodes"
  {
    echo "127.0.0.1 localhost"
    local k
    for ((k = 0; k < n; k++)); do echo "$SUBNET_PREFIX.$((k + 1)) $(host_of $k)"; done
  } >"$STATE/hosts"
  for ((k = 0; k < n; k++)); do echo "$(host_of $k) slots=64"; done >"$STATE/hostfile"
  ip netns add "$SW" || exit 1
  ip -n "$SW" link add br0 type bridge && ip -n "$SW" link set br0 up && ip -n "$SW" link set lo up || exit 1
  for ((k = 0; k < n; k++)); do
    local ns; ns=$(ns_of $k)
    ip netns add "$ns" || exit 1
    ip -n "$SW" link add "p$k" type veth peer name eth0 netns "$ns" || exit 1
    ip -n "$SW" link set "p$k" master br0 && ip -n "$SW" link set "p$k" up || exit 1
    ip -n "$ns" addr add "$SUBNET_PREFIX.$((k + 1))/24" dev eth0 && ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up || exit 1
    # The holder: its UTS and mount namespaces are the node's. setsid: a
    # Ctrl-C at the terminal reaches the caller, whose trap removes it.
    rm -f "$STATE/holder$k"
    setsid ip netns exec "$ns" unshare --uts --mount --propagation private sh -c '
      hostname "$1" && mount -t tmpfs -o "size=$2,mode=1777" lk-shm /dev/shm && mount --bind "$3" /etc/hosts || exit 1
      echo $$ >"$4.tmp" && mv "$4.tmp" "$4"
      exec sleep infinity' _ "$(host_of $k)" "${LK_NETNS_SHM_SIZE:-1g}" "$STATE/hosts" "$STATE/holder$k" \
      </dev/null >/dev/null 2>"$STATE/holder$k.err" &
  done
  for ((k = 0; k < n; k++)); do
    local t
    for ((t = 0; t < 100; t++)); do [ -s "$STATE/holder$k" ] && break; sleep 0.05; done
    [ -s "$STATE/holder$k" ] || die "node $k's holder did not start: $(cat "$STATE/holder$k.err" 2>/dev/null)"
  done
  # Wait until node 0 reaches every node (the bridge learns, links come up).
  for ((k = 1; k < n; k++)); do
    local t ok=""
    for ((t = 0; t < 50; t++)); do
      if nsenter -t "$(cat "$STATE/holder0")" --net ping -c1 -W1 "$SUBNET_PREFIX.$((k + 1))" >/dev/null 2>&1; then ok=1; break; fi
      command -v ping >/dev/null || { ok=1; break; } # no ping here: trust the links
      sleep 0.1
    done
    [ -n "$ok" ] || die "node 0 cannot reach node $k ($SUBNET_PREFIX.$((k + 1)))"
  done
  [ "$rate" = none ] || apply_shape "$rate" "$shaper" || die "tc could not shape the links to $rate ($shaper)"
  trap - EXIT INT TERM HUP
  echo "cluster '$ID': $n nodes ($(hosts_list)), subnet $SUBNET_PREFIX.0/24, links ${rate/none/unshaped}"
}

cmd_down() {
  [ -d "$STATE" ] || { ip netns list 2>/dev/null | grep -q "^$ID-" || return 0; }
  local pids="" ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$ID-(sw|n[0-9]+)$"); do
    pids="$pids $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
  done
  [ -s "$STATE/slurm/munged.pid" ] && pids="$pids $(cat "$STATE/slurm/munged.pid")" # (in this machine's namespaces)
  local f
  for f in "$STATE"/holder[0-9]*; do
    case $f in *.err|*.tmp) continue ;; esac
    [ -s "$f" ] && pids="$pids $(cat "$f")"
  done
  pids=$(echo $pids | tr ' ' '\n' | grep -v "^$$\$" | sort -u | tr '\n' ' ')
  if [ -n "${pids// /}" ]; then
    kill -TERM $pids 2>/dev/null
    local t
    for ((t = 0; t < 20; t++)); do
      local alive=""
      for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
      [ -z "$alive" ] && break
      sleep 0.1
    done
    kill -KILL $pids 2>/dev/null
  fi
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$ID-(sw|n[0-9]+)$"); do
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$STATE"
  rmdir /run/lk-netns 2>/dev/null
  echo "cluster '$ID' removed"
  return 0
}

need_up() { [ -s "$STATE/nodes" ] || die "cluster '$ID' is not up ('$0 up N' first, or set LK_NETNS_ID)"; }

cmd_exec() {
  need_up
  local k; k=$(node_index "${1:-}") || exit 1
  shift
  [ $# -gt 0 ] || die "exec: no command"
  local pid; pid=$(cat "$STATE/holder$k")
  kill -0 "$pid" 2>/dev/null || die "node $k's holder (pid $pid) is gone; '$0 down' and up again"
  exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- "$@"
}

# mpirun's rsh agent: "agent [options] host command words..." with the
# command meant for a remote shell. It behaves as `ssh -o
# ServerAliveInterval=I -o ServerAliveCountMax=C` does: the session lasts as
# long as the command, and when the far node stops answering (I s between
# probes, C misses in a row: a TCP probe over the cluster's network, from
# the node mpirun runs on) the session ends: the command's process group gets
# SIGTERM (as sshd's hang-up would end it) and the agent exits 255 (ssh's
# status for a lost connection), which mpirun takes for a lost daemon and
# ends the job. Without this a cut link leaves mpirun and the far node's
# orted waiting on TCP for many minutes. LK_NETNS_ALIVE="I C" (default
# "1 8"; "0" turns the probes off).
# Whether ADDR answers within SECS: a TCP connection to port 1, where
# nothing listens, is refused at once by a node that is there (or accepted,
# if something does listen); a dead link or node lets it time out. No ping
# needed (it is not installed everywhere).
node_answers() {
  timeout "$2" bash -c 'exec 3<>"/dev/tcp/$0/1"' "$1" 2>/dev/null
  [ $? != 124 ]
}

cmd_rsh() {
  while [ $# -gt 0 ]; do
    case $1 in
      -l|-p|-o|-i) shift 2 ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  local host=${1:-}; shift || true
  need_up
  local k; k=$(node_index "$host") || exit 255
  local pid; pid=$(cat "$STATE/holder$k")
  kill -0 "$pid" 2>/dev/null || { echo "netns-cluster rsh: node $k's holder (pid $pid) is gone" >&2; exit 255; }
  local iv cnt
  read -r iv cnt <<<"${LK_NETNS_ALIVE:-1 8}"
  # setsid: the command's own process group, so that ending the session
  # reaches orted and what it started, as a hang-up does.
  setsid nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- /bin/sh -c "$*" &
  local child=$! addr=$SUBNET_PREFIX.$((k + 1))
  trap 'kill -TERM -- -$child 2>/dev/null; exit 255' TERM INT HUP
  if [ "${iv:-0}" != 0 ]; then
    local miss=0
    while kill -0 $child 2>/dev/null; do
      if node_answers "$addr" "$iv"; then miss=0; sleep "$iv"; else miss=$((miss + 1)); fi
      if [ $miss -ge "${cnt:-8}" ]; then
        echo "netns-cluster rsh: node $k ($(host_of $k), $addr) has not answered for $((iv * cnt)) s (its link is down," \
          "or the node is gone): ending its session, as ssh with ServerAliveInterval=$iv ServerAliveCountMax=$cnt does" >&2
        kill -TERM -- -$child 2>/dev/null
        sleep 1
        kill -KILL -- -$child 2>/dev/null
        wait $child 2>/dev/null
        # mpirun (OpenMPI 4) notices the lost daemon but then waits on its
        # TCP connection to it for minutes: stop it, as a batch system ends
        # a job whose node it marked down. Its SIGTERM handling ends the
        # ranks on the nodes it still reaches (OpenMPI 4.1's mpirun may
        # crash in PMIx_Finalize doing so, after its ranks are gone); KILL
        # after 5 s. LK_NETNS_LOST_NODE_STOPS_MPIRUN=0 leaves it running.
        local mp; mp=$(ps -o ppid= -p $$ | tr -d ' ')
        if [ "${LK_NETNS_LOST_NODE_STOPS_MPIRUN:-1}" = 1 ] && [ -n "$mp" ] && [ "$(ps -o comm= -p "$mp")" = mpirun ]; then
          echo "netns-cluster rsh: stopping mpirun (pid $mp): node $k is lost" >&2
          kill -TERM "$mp" 2>/dev/null
          local t
          for ((t = 0; t < 50; t++)); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
          kill -KILL "$mp" 2>/dev/null
        fi
        exit 255
      fi
    done
  fi
  wait $child
}

cmd_mpirun() {
  need_up
  local flags=()
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
  # The cluster's host file unless the caller names hosts itself (OpenMPI
  # refuses two host files; a test of a bad host file passes its own).
  local a own=""
  for a in "$@"; do
    case $a in --hostfile|-hostfile|--machinefile|-machinefile|--host|-host|-H|--default-hostfile) own=1 ;; esac
  done
  [ -n "$own" ] || flags+=(--hostfile "$STATE/hostfile")
  # vader (shared memory) inside a node, tcp across nodes on eth0 only;
  # mpirun's out-of-band channel to the other nodes' orted also on eth0.
  cmd_exec 0 mpirun "${flags[@]}" \
    --mca plm_rsh_agent "$SELF rsh" --mca plm_rsh_no_tree_spawn 1 --leave-session-attached \
    --mca btl self,vader,tcp --mca btl_tcp_if_include "$SUBNET_PREFIX.0/24" \
    --mca oob_tcp_if_include "$SUBNET_PREFIX.0/24" -x LK_NETNS_ID="$ID" "$@"
}

# ---- SLURM --------------------------------------------------------------------
# Everything lives in $STATE/slurm: the munge key and socket (one munged, in
# this machine's namespaces, serves every node through its socket file:
# unix sockets cross network namespaces), slurm.conf and cgroup.conf, the
# controller's state, each node's spool and TmpFS (%n: PMIx puts its client
# directories there, and the nodes share this machine's /tmp), the logs.
# No service of the machine is touched; `down` stops it all.
SLURM_DIR=$STATE/slurm

slurm_why_not() {
  local t
  for t in slurmctld slurmd munged srun sbatch sinfo; do
    command -v $t >/dev/null || { echo "$t is not installed (Debian: slurmd slurmctld slurm-client munge)"; return; }
  done
  local why; why=$(why_not)
  [ -z "$why" ] || { echo "$why"; return; }
  [ -d /sys/fs/cgroup ] || echo "no /sys/fs/cgroup (slurmd needs a cgroup hierarchy)"
}

cmd_slurm_check() {
  local why; why=$(slurm_why_not)
  [ -z "$why" ] && return 0
  echo "skipped: $why"
  exit 77
}

cmd_slurm_up() {
  need_up
  local why; why=$(slurm_why_not)
  [ -z "$why" ] || die "slurm-up: SLURM cannot run here: $why"
  [ -e "$SLURM_DIR" ] && die "slurm-up: SLURM is up already on cluster '$ID'"
  local n k; n=$(nnodes)
  mkdir -p "$SLURM_DIR/state" || exit 1
  head -c 1024 /dev/urandom >"$SLURM_DIR/munge.key" && chmod 600 "$SLURM_DIR/munge.key" || exit 1
  munged -f --socket="$SLURM_DIR/munge.sock" --key-file="$SLURM_DIR/munge.key" --log-file="$SLURM_DIR/munged.log" \
    --pid-file="$SLURM_DIR/munged.pid" --seed-file="$SLURM_DIR/munged.seed" 2>"$SLURM_DIR/munged.err" ||
    die "slurm-up: munged did not start: $(cat "$SLURM_DIR/munged.err")"
  # cgroup v1 (a tmpfs of controllers) or v2 (one cgroup2 mount); no systemd
  local cg=cgroup/v1
  [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && cg=cgroup/v2
  printf 'CgroupPlugin=%s\nCgroupMountpoint=/sys/fs/cgroup\nIgnoreSystemd=yes\n' "$cg" >"$SLURM_DIR/cgroup.conf"
  local cpus; cpus=$(nproc)
  {
    echo "ClusterName=$ID"
    echo "SlurmctldHost=$(host_of 0)($SUBNET_PREFIX.1)"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$SLURM_DIR/munge.sock"
    echo "CredType=cred/munge"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$SLURM_DIR/state"
    echo "SlurmdSpoolDir=$SLURM_DIR/spool/%n"
    echo "TmpFS=$SLURM_DIR/tmp/%n"
    echo "SlurmctldPidFile=$SLURM_DIR/slurmctld.pid"
    echo "SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid"
    echo "SlurmctldLogFile=$SLURM_DIR/slurmctld.log"
    echo "SlurmdLogFile=$SLURM_DIR/slurmd.%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    # a step whose node is lost is given up 5 s after its cancel (SLURM's default 30 s)
    echo "KillWait=5"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "JobCompType=jobcomp/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    # every node offers this machine's CPUs: the nodes share them
    for ((k = 0; k < n; k++)); do echo "NodeName=$(host_of $k) NodeAddr=$SUBNET_PREFIX.$((k + 1)) CPUs=$cpus State=UNKNOWN"; done
    echo "PartitionName=lk Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE"
  } >"$SLURM_DIR/slurm.conf"
  for ((k = 0; k < n; k++)); do mkdir -p "$SLURM_DIR/spool/$(host_of $k)" "$SLURM_DIR/tmp/$(host_of $k)" || exit 1; done
  (cmd_exec 0 setsid slurmctld -D -f "$SLURM_DIR/slurm.conf" </dev/null >"$SLURM_DIR/slurmctld.out" 2>&1 &)
  for ((k = 0; k < n; k++)); do
    (cmd_exec $k setsid slurmd -D -N "$(host_of $k)" -f "$SLURM_DIR/slurm.conf" </dev/null \
      >"$SLURM_DIR/slurmd.$k.out" 2>&1 &)
  done
  local t idle=0
  for ((t = 0; t < 150; t++)); do
    idle=$(cmd_slurm sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$idle" = "$n" ] && break
    sleep 0.2
  done
  if [ "$idle" != "$n" ]; then
    echo "netns-cluster: slurm-up: $idle of $n nodes idle after 30 s; the daemons said:" >&2
    tail -n 3 "$SLURM_DIR"/*.out "$SLURM_DIR"/*.log >&2 2>/dev/null
    exit 1
  fi
  echo "slurm on cluster '$ID': slurmctld on $(host_of 0), slurmd on $n nodes ($cg), SLURM_CONF=$SLURM_DIR/slurm.conf"
}

cmd_slurm() {
  need_up
  [ -s "$SLURM_DIR/slurm.conf" ] || die "SLURM is not up on cluster '$ID' ('$0 slurm-up' first)"
  [ $# -gt 0 ] || die "slurm: no command"
  cmd_exec 0 env SLURM_CONF="$SLURM_DIR/slurm.conf" "$@"
}

cmd_bytes() {
  need_up
  local k; k=$(node_index "${1:-}") || exit 1
  ip -n "$(ns_of $k)" -s -j link show eth0 2>/dev/null |
    sed -n 's/.*"rx":{"bytes":\([0-9]*\).*"tx":{"bytes":\([0-9]*\).*/\1 \2/p'
}

cmd_status() {
  [ -d "$STATE" ] || { echo "cluster '$ID' is not up"; return 1; }
  echo "cluster '$ID': $(nnodes) nodes ($(hosts_list)), subnet $SUBNET_PREFIX.0/24, links $(cat "$STATE/rate" 2>/dev/null || echo unshaped)"
  local k
  for ((k = 0; k < $(nnodes); k++)); do
    echo "  node $k: $(host_of $k) $SUBNET_PREFIX.$((k + 1)) netns $(ns_of $k) holder $(cat "$STATE/holder$k" 2>/dev/null) rx/tx $(cmd_bytes $k)"
  done
}

cmd_run() {
  local n=${1:-}; shift || true
  local up=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do up+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "run: no command (run N [--rate R] -- CMD...)"
  trap '[ -n "$RUN_CHILD" ] && kill -TERM $RUN_CHILD 2>/dev/null; cmd_down >/dev/null 2>&1' EXIT
  trap 'exit 130' INT TERM HUP
  (cmd_up "$n" "${up[@]}") || exit 1
  # In the background, so that a signal to this script runs the trap at
  # once instead of after the command.
  LK_NETNS_ID=$ID "$@" &
  RUN_CHILD=$!
  wait $RUN_CHILD
  local rc=$?
  RUN_CHILD=""
  return $rc
}

sub=${1:-}
shift || true
case $sub in
  check) cmd_check ;;
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  exec) cmd_exec "$@" ;;
  rsh) cmd_rsh "$@" ;;
  mpirun) cmd_mpirun "$@" ;;
  shape)
    need_up
    [ $# -ge 1 ] || die "shape: expected a rate (e.g. 1gbit) or none"
    r=$1; shift; s=tbf
    [ "${1:-}" = --shaper ] && s=${2:-tbf}
    apply_shape "$r" "$s" || die "tc could not shape the links to $r ($s)" ;;
  slurm-check) cmd_slurm_check ;;
  slurm-up) cmd_slurm_up ;;
  slurm) cmd_slurm "$@" ;;
  bytes) cmd_bytes "$@" ;;
  hosts) need_up; hosts_list ;;
  hostfile) need_up; echo "$STATE/hostfile" ;;
  status) cmd_status ;;
  run) cmd_run "$@" ;;
  *) sed -n '2,/^set -u/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; [ -z "$sub" ] || [ "$sub" = -h ] || [ "$sub" = --help ] || exit 2 ;;
esac
