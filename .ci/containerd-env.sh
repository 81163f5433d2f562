#!/usr/bin/env bash
# containerd-env.sh — a throw-away containerd (CRI) + two local registries for integration tests.
#
# Usage (run):
#   .ci/containerd-env.sh install      # apt-get install the tools if missing (root, Debian)
#   .ci/containerd-env.sh up   DIR     # start everything under DIR, write DIR/env
#                                      # (runs `install` first if a tool is missing)
#   .ci/containerd-env.sh down DIR     # stop only what `up DIR` started (by pid files)
# Usage (sourced):
#   source .ci/containerd-env.sh
#   containerd_env_up DIR     # same as `up`, and also exports the DIR/env variables
#   containerd_env_down DIR
#
# What `up DIR` starts, all bound to 127.0.0.1 only:
#   * docker-registry (distribution 2.8) without auth      -> REGISTRY_OPEN=127.0.0.1:PORT
#   * docker-registry with htpasswd (bcrypt) basic auth    -> REGISTRY_AUTH=127.0.0.1:PORT
#     user `imaged`, password `s3cret-pw` (fixed test credentials)
#   * containerd 1.6 with its own config: root/state under DIR, gRPC socket DIR/containerd.sock,
#     CRI plugin on, snapshotter "native" (no overlayfs needed), plain-HTTP host config for
#     both registries (see CONTAINERD_ENV_REGISTRY_CONFIG), no CNI config (the CRI plugin
#     still loads; only pod networking is "not ready"), debug and metrics listeners off,
#     CRI streaming server on 127.0.0.1 with a random port. Must run as root.
# DIR/env (KEY=VALUE lines, no quoting) then holds:
#   CONTAINERD_SOCK, CONTAINERD_PID_FILE, REGISTRY_OPEN, REGISTRY_OPEN_PID_FILE,
#   REGISTRY_AUTH, REGISTRY_AUTH_PID_FILE, REGISTRY_USER, REGISTRY_PASS, CONTAINERD_ENV_DIR
# Logs: DIR/containerd.log, DIR/registry-open.log, DIR/registry-auth.log.
#
# Every wait is bounded (CONTAINERD_ENV_TIMEOUT seconds, default 30). Nothing reaches the network.

CONTAINERD_ENV_USER=imaged
CONTAINERD_ENV_PASS=s3cret-pw
: "${CONTAINERD_ENV_TIMEOUT:=30}"
# How containerd learns that the registries speak plain HTTP: `hosts` (config_path with
# DIR/certs.d/127.0.0.1:PORT/hosts.toml, default) or `mirrors` (legacy registry.mirrors).
# Both are verified with containerd 1.6.20 CRI pulls (with and without credentials).
: "${CONTAINERD_ENV_REGISTRY_CONFIG:=hosts}"

_ce_log() { printf 'containerd-env: %s\n' "$*" >&2; }

_ce_require_dir() {
  local dir=${1:-}
  if [[ -z "$dir" ]]; then
    _ce_log "missing DIR argument"
    return 2
  fi
  if [[ "$dir" =~ [[:space:]\"\'\\] ]]; then
    _ce_log "DIR must not contain whitespace, quotes or backslashes: $dir"
    return 2
  fi
  return 0
}

# Install the Debian packages this script needs, if any binary is missing.
containerd_env_install() {
  local missing=()
  command -v containerd >/dev/null 2>&1 || missing+=(containerd)
  command -v ctr >/dev/null 2>&1 || missing+=(containerd)
  [[ -x /usr/bin/docker-registry ]] || missing+=(docker-registry)
  command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    _ce_log "missing tools (${missing[*]}) and cannot apt-get install them (need root on Debian)"
    return 1
  fi
  _ce_log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || return 1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null || return 1
}

# Print the HTTP status code of GET /v2/ on 127.0.0.1:PORT, or nothing. Bounded (2 s read).
_ce_http_status() {
  local port=$1 line=""
  # A refused connect on loopback fails at once; `timeout` guards the rest.
  # shellcheck disable=SC2016 # $1 expands in the inner bash
  line=$(timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n" "$1" >&3
    IFS= read -r -t 2 l <&3 && printf "%s" "$l"
  ' _ "$port" 2>/dev/null) || true
  # "HTTP/1.0 200 OK\r"
  if [[ "$line" =~ ^HTTP/[0-9.]+\ ([0-9]{3}) ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
  fi
  return 0
}

# True if something already listens on 127.0.0.1:PORT.
_ce_port_busy() {
  # shellcheck disable=SC2016 # $1 expands in the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

_ce_pid_alive() {
  local pid=$1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

# Start one registry. $1 = name (open|auth), $2 = DIR. Writes DIR/registry-NAME.{yml,pid,port}.
_ce_start_registry() {
  local name=$1 dir=$2 attempt port pid status want deadline
  local cfg="$dir/registry-$name.yml" log="$dir/registry-$name.log" pidf="$dir/registry-$name.pid"
  mkdir -p "$dir/registry-$name-data" || return 1
  if [[ $name == auth ]]; then want=401; else want=200; fi
  for attempt in 1 2 3 4 5 6 7 8; do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    _ce_port_busy "$port" && continue
    {
      printf 'version: 0.1\n'
      printf 'log:\n  level: info\n  accesslog:\n    disabled: false\n'
      printf 'storage:\n  filesystem:\n    rootdirectory: %s\n' "$dir/registry-$name-data"
      printf '  delete:\n    enabled: true\n'
      printf '  cache:\n    blobdescriptor: inmemory\n'
      printf 'http:\n  addr: 127.0.0.1:%s\n' "$port"
      printf '  headers:\n    X-Content-Type-Options: [nosniff]\n'
      if [[ $name == auth ]]; then
        printf 'auth:\n  htpasswd:\n    realm: imaged-test\n    path: %s\n' "$dir/htpasswd"
      fi
    } >"$cfg" || return 1
    /usr/bin/docker-registry serve "$cfg" >"$log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pidf"
    deadline=$((SECONDS + CONTAINERD_ENV_TIMEOUT))
    while ((SECONDS < deadline)); do
      if ! _ce_pid_alive "$pid"; then
        break
      fi
      status=$(_ce_http_status "$port")
      if [[ "$status" == "$want" ]]; then
        echo "$port" >"$dir/registry-$name.port"
        _ce_log "registry-$name ready on 127.0.0.1:$port (pid $pid)"
        return 0
      fi
      sleep 0.2
    done
    if _ce_pid_alive "$pid"; then
      _ce_log "registry-$name did not answer $want on 127.0.0.1:$port" \
        "within ${CONTAINERD_ENV_TIMEOUT}s"
      tail -n 20 "$log" >&2
      return 1
    fi
    wait "$pid" 2>/dev/null
    _ce_log "registry-$name exited on port $port (attempt $attempt); retrying with another port"
    tail -n 5 "$log" >&2
    rm -f "$pidf"
  done
  _ce_log "registry-$name could not start"
  return 1
}

_ce_write_containerd_config() {
  local dir=$1 open=$2 auth=$3
  cat >"$dir/containerd.toml" <<EOF
# Generated by containerd-env.sh (containerd 1.6, config version 2).
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
# No external plugins; snapshotters that need special kernels/filesystems are switched off.
plugin_dir = ""
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]
oom_score = 0

[grpc]
  address = "$dir/containerd.sock"
  uid = 0
  gid = 0

[ttrpc]
  address = "$dir/containerd.sock.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  # Only used to run pods, never pulled by image operations; kept local so nothing points outside.
  sandbox_image = "127.0.0.1:$open/pause:3.6"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

  # No CNI config on purpose: the CRI plugin loads and image operations work; only
  # RuntimeStatus reports NetworkReady=false.
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$dir/cni/bin"
    conf_dir = "$dir/cni/net.d"

EOF
  case "$CONTAINERD_ENV_REGISTRY_CONFIG" in
    hosts)
      # config_path + hosts.toml (the non-deprecated form; also what containerd 2.x reads).
      local port
      for port in "$open" "$auth"; do
        mkdir -p "$dir/certs.d/127.0.0.1:$port" || return 1
        cat >"$dir/certs.d/127.0.0.1:$port/hosts.toml" <<EOF
server = "http://127.0.0.1:$port"

[host."http://127.0.0.1:$port"]
  capabilities = ["pull", "resolve"]
EOF
      done
      cat >>"$dir/containerd.toml" <<EOF

  # Plain-HTTP access to the two loopback registries: $dir/certs.d/127.0.0.1:PORT/hosts.toml
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/certs.d"
EOF
      ;;
    mirrors)
      # Legacy 1.6 mirror config (containerd logs a deprecation warning for it).
      cat >>"$dir/containerd.toml" <<EOF

  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."127.0.0.1:$open"]
    endpoint = ["http://127.0.0.1:$open"]
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."127.0.0.1:$auth"]
    endpoint = ["http://127.0.0.1:$auth"]
EOF
      ;;
    *)
      _ce_log "CONTAINERD_ENV_REGISTRY_CONFIG must be 'hosts' or 'mirrors'," \
        "not '$CONTAINERD_ENV_REGISTRY_CONFIG'"
      return 2
      ;;
  esac
}

_ce_start_containerd() {
  local dir=$1 pid deadline cri
  local sock="$dir/containerd.sock" log="$dir/containerd.log"
  mkdir -p "$dir/containerd/root" "$dir/containerd/state" "$dir/containerd/opt" \
    "$dir/cni/bin" "$dir/cni/net.d" || return 1
  containerd --config "$dir/containerd.toml" >"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/containerd.pid"
  deadline=$((SECONDS + CONTAINERD_ENV_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! _ce_pid_alive "$pid"; then
      _ce_log "containerd exited; last log lines:"
      tail -n 30 "$log" >&2
      return 1
    fi
    if [[ -S "$sock" ]] && timeout 5 ctr --address "$sock" version >/dev/null 2>&1; then
      cri=$(timeout 5 ctr --address "$sock" plugins ls 2>/dev/null |
        awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" { print $NF }')
      if [[ "$cri" == ok ]]; then
        _ce_log "containerd ready on $sock (pid $pid)"
        return 0
      fi
      if [[ -n "$cri" ]]; then
        _ce_log "containerd is up but its CRI plugin is '$cri'; log:"
        grep -iE 'cri|error|fail' "$log" | tail -n 30 >&2
        return 1
      fi
    fi
    sleep 0.2
  done
  _ce_log "containerd not ready within ${CONTAINERD_ENV_TIMEOUT}s; last log lines:"
  tail -n 30 "$log" >&2
  return 1
}

_ce_up() {
  local dir=${1:-} open auth sock
  _ce_require_dir "$dir" || return $?
  containerd_env_install || return 1
  mkdir -p "$dir" || return 1
  dir=$(cd "$dir" && pwd -P) || return 1
  sock="$dir/containerd.sock"
  if ((${#sock} > 100)); then
    _ce_log "socket path too long for a unix socket (${#sock} chars): $sock"
    return 2
  fi
  if [[ -e "$dir/env" ]]; then
    _ce_log "$dir/env exists: run 'down $dir' first or use a fresh DIR"
    return 1
  fi
  htpasswd -Bbn "$CONTAINERD_ENV_USER" "$CONTAINERD_ENV_PASS" >"$dir/htpasswd" || return 1

  if ! _ce_start_registry open "$dir" || ! _ce_start_registry auth "$dir"; then
    containerd_env_down "$dir"
    return 1
  fi
  open=$(<"$dir/registry-open.port")
  auth=$(<"$dir/registry-auth.port")
  _ce_write_containerd_config "$dir" "$open" "$auth" || { containerd_env_down "$dir"; return 1; }
  if ! _ce_start_containerd "$dir"; then
    containerd_env_down "$dir"
    return 1
  fi
  cat >"$dir/env.tmp" <<EOF
CONTAINERD_ENV_DIR=$dir
CONTAINERD_SOCK=$sock
CONTAINERD_PID_FILE=$dir/containerd.pid
REGISTRY_OPEN=127.0.0.1:$open
REGISTRY_OPEN_PID_FILE=$dir/registry-open.pid
REGISTRY_AUTH=127.0.0.1:$auth
REGISTRY_AUTH_PID_FILE=$dir/registry-auth.pid
REGISTRY_USER=$CONTAINERD_ENV_USER
REGISTRY_PASS=$CONTAINERD_ENV_PASS
EOF
  mv "$dir/env.tmp" "$dir/env" || return 1
  _ce_log "environment written to $dir/env"
  return 0
}

# Prints the pid in pid file $1 if that process is alive and still runs program $2
# (guards against pid reuse); removes stale pid files.
_ce_live_pid() {
  local pidf=$1 expect=$2 pid cmd
  [[ -f "$pidf" ]] || return 1
  pid=$(<"$pidf")
  if [[ ! "$pid" =~ ^[0-9]+$ ]] || ! _ce_pid_alive "$pid"; then
    rm -f "$pidf"
    return 1
  fi
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)
  if [[ "$cmd" != *"$expect"* ]]; then
    _ce_log "pid $pid from $pidf is not $expect any more ($cmd); leaving it alone"
    rm -f "$pidf"
    return 1
  fi
  printf '%s' "$pid"
}

# TERM the given pids, wait up to 10 s for all of them, then KILL the rest (and wait 5 s more).
_ce_stop_pids() {
  local pid i alive
  (($# == 0)) && return 0
  kill -TERM "$@" 2>/dev/null
  for ((i = 0; i < 100; i++)); do
    alive=()
    for pid in "$@"; do _ce_pid_alive "$pid" && alive+=("$pid"); done
    ((${#alive[@]} == 0)) && break
    sleep 0.1
  done
  alive=()
  for pid in "$@"; do _ce_pid_alive "$pid" && alive+=("$pid"); done
  if ((${#alive[@]} > 0)); then
    _ce_log "pids ${alive[*]} ignored TERM; sending KILL"
    kill -KILL "${alive[@]}" 2>/dev/null
    for ((i = 0; i < 50; i++)); do
      alive=()
      for pid in "$@"; do _ce_pid_alive "$pid" && alive+=("$pid"); done
      ((${#alive[@]} == 0)) && break
      sleep 0.1
    done
  fi
  # Reap them if they are our children (sourced use); harmless otherwise.
  for pid in "$@"; do wait "$pid" 2>/dev/null; done
  return 0
}

_ce_stop_shims() {
  # containerd-shim-runc-v2 processes only exist if containers were started; they are
  # children of this containerd's namespaces (their cmdline names our socket address).
  local dir=$1 p cmd
  for p in /proc/[0-9]*; do
    [[ -r "$p/cmdline" ]] || continue
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)
    if [[ "$cmd" == containerd-shim* && "$cmd" == *"$dir/containerd.sock"* ]]; then
      kill -TERM "${p#/proc/}" 2>/dev/null
    fi
  done
}

_ce_down() {
  local dir=${1:-}
  _ce_require_dir "$dir" || return $?
  [[ -d "$dir" ]] || return 0
  dir=$(cd "$dir" && pwd -P) || return 1
  local pid pids=() f
  # containerd first (it may still be pulling from the registries), then both registries.
  if pid=$(_ce_live_pid "$dir/containerd.pid" containerd); then
    _ce_stop_pids "$pid"
  fi
  rm -f "$dir/containerd.pid"
  _ce_stop_shims "$dir"
  for f in registry-open registry-auth; do
    if pid=$(_ce_live_pid "$dir/$f.pid" docker-registry); then
      pids+=("$pid")
    fi
  done
  _ce_stop_pids "${pids[@]}"
  rm -f "$dir/registry-open.pid" "$dir/registry-auth.pid"
  rm -f "$dir/env"
  _ce_log "stopped processes started under $dir"
  return 0
}

# The public entry points call the implementations on the left of `||`, so a caller's
# `set -e` cannot abort them halfway (bash ignores errexit there); they return a status.
containerd_env_up() {
  local rc=0 dir
  _ce_up "$@" || rc=$?
  if ((rc != 0)); then
    _ce_log "up failed (status $rc)"
    return "$rc"
  fi
  # Export DIR/env into the caller (useful when sourced; harmless when run).
  dir=$(cd "${1:-}" && pwd -P) || return 1
  _ce_export_env "$dir" || return 1
}

containerd_env_down() {
  local rc=0
  _ce_down "$@" || rc=$?
  return "$rc"
}

_ce_export_env() {
  local dir=$1 line
  while IFS= read -r line; do
    if [[ "$line" =~ ^[A-Z_][A-Z0-9_]*= ]]; then
      export "${line?}"
    fi
  done <"$dir/env"
  return 0
}

_ce_main() {
  case "${1:-}" in
    install) containerd_env_install || return $? ;;
    up) containerd_env_up "${2:-}" ;;
    down) containerd_env_down "${2:-}" ;;
    *)
      echo "usage: $0 install | up DIR | down DIR" >&2
      return 2
      ;;
  esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  _ce_main "$@"
  exit $?
fi
