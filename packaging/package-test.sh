#!/bin/bash
# The installed package, tested as a user runs it. `packaging/quickstart
# package-test` runs this inside a fresh Debian 12 root in two phases:
#
#   package-test.sh install DEB   (systemd-nspawn, network): apt install the
#       package as a user would, systemd-analyze verify its units, enable
#       the nginx site, and enable the unit that runs the second phase;
#   package-test.sh check         (systemd-nspawn --boot, systemd as PID 1,
#       private network): run by that unit after boot, with PostgreSQL,
#       nginx, codexec-gateway.service and codexec.socket started by systemd
#       itself, under every hardening directive of the shipped units.
#
# `check` creates the database as docs/operations.md says, runs code and downloads
# its artifact through nginx, checks socket activation, the units'
# hardening, the kernels' user, /metrics, logrotate's SIGHUP, reload and a
# stopped service coming back on the next request. It ends with
# "package-test: ok" and writes its exit status to /var/tmp/pkg/rc.
set -euo pipefail
say() { printf 'package-test: %s\n' "$*"; }
fail() { say "FAILED: $*"; exit 1; }
here=/var/tmp/pkg

# A block of docs/operations.md marked "<!-- verify-host: NAME -->", run as
# written (in $here, beside the packages), each command echoed.
docs_block() {  # docs_block NAME -> its stdout
  local script
  script=$(sed -n "/^<!-- verify-host: $1 -->\$/,/^<!-- \\/verify-host -->\$/p" "$here/operations.md" |
    grep -v -e '^<!--' -e '^```')
  [ -n "$script" ] || fail "no block '$1' in docs/operations.md"
  (cd "$here" && bash -euxo pipefail -c "$script")
}

phase_install() {
  local deb=$1 mod=$2
  export DEBIAN_FRONTEND=noninteractive
  say "apt install $deb and $mod (and what they recommend), PostgreSQL, nginx, systemd"
  apt-get update -qq
  apt-get install -y -qq curl systemd procps logrotate >/dev/null
  grep -qF "./$(basename "$deb") ./$(basename "$mod")" "$here/operations.md" ||
    fail "docs/operations.md does not install $(basename "$deb") and $(basename "$mod")"
  say "docs/operations.md's install block: the packages, the nginx site"
  docs_block install >/dev/null
  [ -L /etc/nginx/modules-enabled/50-mod-http-codexec-link.conf ] ||
    fail "the link module's package did not enable it"
  local unit=/lib/systemd/system
  say "systemd-analyze verify"
  systemd-analyze verify --man=no $unit/codexec.socket $unit/codexec.service \
    $unit/codexec-gateway.service
  cat >/etc/systemd/system/codexec-package-test.service <<EOF
[Unit]
Description=codexec package test (second phase)
After=multi-user.target postgresql.service nginx.service codexec-gateway.service codexec.socket
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/bin/bash $here/package-test.sh check
StandardOutput=append:$here/check.log
StandardError=append:$here/check.log
TimeoutStartSec=900

[Install]
WantedBy=multi-user.target
EOF
  systemctl enable codexec-package-test.service
  # a booted container needs a machine id and no getty on the console
  systemd-machine-id-setup >/dev/null
  systemctl mask console-getty.service getty@tty1.service >/dev/null 2>&1 || true
  say "installed"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local n=$1 what=$2
  shift 2
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  fail "$what"
}

run_code() {  # run_code KEY CONVERSATION CODE [LANGUAGE] -> the answer
  python3 - "$1" "$2" "$3" "${4:-python}" <<'EOF'
import json, sys, urllib.error, urllib.request
key, conv, code, lang = sys.argv[1:]
req = urllib.request.Request("http://127.0.0.1/v1/runs",
    data=json.dumps({"conversation_id": conv, "code": code, "timeout": 120,
                     "language": lang}).encode(),
    headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req, timeout=300).read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
EOF
}

field() {  # field JSON EXPR
  printf '%s' "$1" | python3 -c "import json, sys; d = json.load(sys.stdin); print($2)"
}

check_hardening() {
  local p
  for p in ProtectSystem=strict NoNewPrivileges=yes PrivateTmp=yes ProtectHome=yes \
           User=codexec MemoryDenyWriteExecute=yes RestrictNamespaces=yes; do
    systemctl show codexec.service -p "${p%%=*}" | grep -qx "$p" ||
      fail "codexec.service does not run with $p"
  done
  systemctl show codexec-gateway.service -p User | grep -qx User=codexec-kernel ||
    fail "the gateway does not run as codexec-kernel"
  systemctl show codexec-gateway.service -p Delegate | grep -qx Delegate=yes ||
    fail "the gateway has no delegated cgroup"
  systemctl show codexec-gateway.service -p NoNewPrivileges | grep -qx NoNewPrivileges=yes ||
    fail "the gateway runs without NoNewPrivileges"
  local tok code
  tok=$(sed -n 's/^JUPYTER_TOKEN=//p' /etc/codexec/gateway.env)
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: token $tok" \
    http://127.0.0.1:18888/api/terminals)
  [ "$code" = 404 ] || fail "the gateway offers terminals (POST /api/terminals answered $code)"
  say "hardening: in force (ProtectSystem=strict, NoNewPrivileges, PrivateTmp, ...); no terminals"
  # Type=notify: the service is active only once codexec-fcgi said READY=1
  # (a service that never says it fails its start after TimeoutStartSec)
  systemctl show codexec.service -p Type | grep -qx Type=notify || fail "codexec.service is not Type=notify"
  systemctl show codexec.service -p WatchdogUSec | grep -qx WatchdogUSec=30s ||
    fail "codexec.service has no 30 s watchdog"
  systemctl is-active -q codexec.service || fail "codexec.service is not active (no READY=1?)"
  [ "$(systemctl show codexec.service -p StatusErrno --value)" = 0 ] || fail "codexec.service has an error"
  systemctl show codexec.service -p SystemCallFilter | grep -q 'SystemCallFilter=.' ||
    fail "codexec.service filters no system call"
  [ "$(systemctl show codexec-gateway.service -p CapabilityBoundingSet --value)" = "" ] ||
    fail "the gateway keeps capabilities"
  say "notify: codexec.service said READY=1 (active, Type=notify, watchdog 30 s); system calls filtered; the gateway has no capabilities"
}

check_kernel_user_reads_nothing() {
  local f
  for f in /etc/codexec/secret /etc/codexec/codexec.conf /etc/codexec/gateway.env; do
    if runuser -u codexec-kernel -- cat "$f" >/dev/null 2>&1; then
      fail "codexec-kernel can read $f"
    fi
  done
  if runuser -u codexec-kernel -- ls /var/lib/codexec/storage >/dev/null 2>&1; then
    fail "codexec-kernel can list the storage"
  fi
  runuser -u codexec-kernel -- cat /etc/codexec/sandbox.conf >/dev/null ||
    fail "codexec-kernel cannot read sandbox.conf"
  say "the kernels' user reads none of codexec's files (secret, config, token, storage)"
}

check_kernels_user() {
  pgrep -u codexec-kernel -f ipykernel >/dev/null || fail "no kernel runs as codexec-kernel"
  if pgrep -u codexec -f ipykernel >/dev/null; then fail "a kernel runs as codexec"; fi
  say "kernels: run as codexec-kernel, none as codexec"
}

check_logrotate() {  # check_logrotate KEY
  local log=/var/log/codexec/codexec.log
  [ -s "$log" ] || fail "codexec wrote no $log"
  logrotate -f /etc/logrotate.d/codexec
  [ -e "$log.1" ] || fail "logrotate did not rotate $log"
  curl -fsS -o /dev/null -H "Authorization: Bearer $1" http://127.0.0.1/v1/artifacts?conversation_id=pkg ||
    fail "no answer after logrotate"
  wait_for 10 "codexec did not reopen its log on SIGHUP" test -s "$log"
  say "logrotate: rotated; codexec reopened its log on SIGHUP"
}

check_restarts() {  # check_restarts KEY
  systemctl reload codexec.service
  curl -fsS -o /dev/null -H "Authorization: Bearer $1" http://127.0.0.1/v1/artifacts?conversation_id=pkg ||
    fail "no answer after systemctl reload"
  systemctl stop codexec.service
  systemctl is-active -q codexec.socket || fail "stopping the service stopped the socket"
  local out
  out=$(run_code "$1" pkg 'print(x)')
  [ "$(field "$out" 'd["status"]')" = ok ] || fail "after a stop the run answered: $out"
  systemctl is-active -q codexec.service || fail "the socket did not start the service again"
  say "reload, stop: the socket starts the service again on the next request"
}

# Whether systemd gave the gateway's unit the memory controller (a host, or
# a VM). Booted by systemd-nspawn on a machine with v1 controllers, the
# container's systemd gets none: its kernels can have no cgroup there.
cgroups_here() {
  local unit=system.slice/codexec-gateway.service
  [ -d "/sys/fs/cgroup/memory/$unit" ] || grep -qw memory "/sys/fs/cgroup/$unit/cgroup.controllers" 2>/dev/null
}

# One tenant's bombs stay in its kernel's cgroup: a memory bomb ends that
# kernel alone (memory.max), a fork bomb stops at pids.max, and another
# tenant's run goes on after each. Only where kernels have cgroups (a host
# or a VM: packaging/quickstart verify-host).
check_tenants_bounded() {  # check_tenants_bounded KEY
  local out
  cgroups_here || return 0
  out=$(run_code "$1" pkg-bomb $'x = bytearray(3 * 1024**3)\nprint(len(x))')
  [ "$(field "$out" 'd.get("error_name")')" = KernelDied ] ||
    fail "a 3 GiB allocation was not ended at memory.max: $out"
  out=$(run_code "$1" pkg-other 'print("still here")')
  [ "$(field "$out" 'd["stdout_tail"].strip()')" = "still here" ] ||
    fail "another tenant's run after the memory bomb: $out"
  out=$(run_code "$1" pkg-forks $'import os\nn = 0\ntry:\n    while n < 2000:\n        if os.fork() == 0:\n            import time; time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print("stopped at", n)')
  case "$(field "$out" 'd["stdout_tail"].strip()')" in
    "stopped at "*) ;;
    *) fail "a fork bomb was not stopped at pids.max: $out" ;;
  esac
  out=$(run_code "$1" pkg-other 'print("still here")')
  [ "$(field "$out" 'd["stdout_tail"].strip()')" = "still here" ] ||
    fail "another tenant's run after the fork bomb: $out"
  say "tenants: a memory bomb ended at memory.max, a fork bomb held at pids.max, other runs unharmed"
}

# Python kernels forked from the template (sandbox.conf: template =
# true) under systemd's hardening and cgroups: the kernel of a run is pid 1
# of its own pid namespace, the template's child (its subreaper), in its
# own cgroup, and shares the data stack's pages: its private memory is a
# small part of what it maps.
check_template() {  # check_template KEY
  local out pid tpl rss priv
  # (check_cgroups' conversation: the key has 8 sessions, and check_restarts
  # needs pkg's to live)
  out=$(run_code "$1" pkg-cgroup $'import sys, os\nprint(os.getpid(), "numpy" in sys.modules)')
  [ "$(field "$out" 'd["stdout_tail"].strip()')" = "1 True" ] ||
    fail "a Python kernel is not pid 1 of its namespace with numpy preloaded: $out"
  pid=$(for p in $(pgrep -u codexec-kernel python3); do
          [ "$(awk '/^NSpid:/ {print NF, $NF}' "/proc/$p/status")" = "3 1" ] && echo "$p"
        done | tail -1)
  [ -n "$pid" ] || fail "no kernel forked from the template (pid 1 of a namespace below the host's)"
  tpl=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status")
  grep -q -- ' --fds ' <(tr '\0' ' ' <"/proc/$tpl/cmdline") ||
    fail "the kernel's parent ($tpl) is not the template"
  rss=$(awk '/^Rss:/ {print $2}' "/proc/$pid/smaps_rollup")
  priv=$(awk '/^Private_Dirty:/ {print $2}' "/proc/$pid/smaps_rollup")
  [ "$priv" -lt 40960 ] && [ "$rss" -gt 81920 ] ||
    fail "the kernel shares too little: $priv KiB private of $rss KiB"
  say "template: the kernel is pid 1 of its namespace, the template's child, $((priv / 1024)) MiB of its $((rss / 1024)) MiB its own"
}

# JavaScript and R under systemd: the package ships both kernelspecs, R
# comes with its recommendations, Deno as docs/sandbox.md installs it; an
# operator turns them on in codexec.conf.
check_languages() {  # check_languages KEY
  local out conf=/etc/codexec/codexec.conf
  [ -x /usr/bin/R ] && [ -d /usr/lib/R/site-library/IRkernel ] ||
    fail "R and IRkernel did not come with the package's recommendations"
  [ -x /usr/local/lib/codexec-deno/deno ] || fail "no Deno in /usr/local/lib/codexec-deno"
  sed -i -e 's|^#kernel_name_r = |kernel_name_r = |' \
    -e 's|^#kernel_name_javascript = |kernel_name_javascript = |' "$conf"
  grep -qx 'kernel_name_r = r-sandbox' "$conf" &&
    grep -qx 'kernel_name_javascript = javascript-sandbox' "$conf" ||
    fail "codexec.conf's commented language lines are not where docs/sandbox.md says"
  systemctl restart codexec.service
  out=$(run_code "$1" pkg-r $'x <- 6 * 7\nplot(1:3)\ncat(x, "\\n")' r)
  [ "$(field "$out" 'd["stdout_tail"].strip()')" = 42 ] &&
    [ "$(field "$out" 'd["artifacts"][0]["mime_type"]')" = image/png ] || fail "an R run: $out"
  out=$(run_code "$1" pkg-js $'const x = 6 * 7;\nconsole.log(x);' javascript)
  [ "$(field "$out" 'd["stdout_tail"].strip()')" = 42 ] || fail "a JavaScript run: $out"
  if cgroups_here; then
    out=$(run_code "$1" pkg-js-bomb $'const a = [];\nwhile (true) a.push(new Uint8Array(64 << 20).fill(1));' javascript)
    [ "$(field "$out" 'd["status"]')" = error ] || fail "a JavaScript memory bomb: $out"
    out=$(run_code "$1" pkg-other 'print("still here")')
    [ "$(field "$out" 'd["stdout_tail"].strip()')" = "still here" ] ||
      fail "another tenant's run after the JavaScript memory bomb: $out"
  fi
  say "languages: R (a plot) and JavaScript run under systemd; a JavaScript memory bomb ended, other runs unharmed"
}

check_cgroups() {  # check_cgroups KEY
  # Delegate=yes: the gateway's user owns its unit's cgroup, so the launcher
  # can make each kernel's cgroup below it.
  local parent=system.slice/codexec-gateway.service/kernels out pid line mem
  # systemd realizes the unit's cgroup in the memory controller's hierarchy
  # only where it manages that controller (on a host, v1 or v2). Booted by
  # systemd-nspawn on a machine with v1 controllers, the container's
  # systemd gets no controller at all: nothing to delegate, said plainly.
  if ! cgroups_here; then
    say "cgroups: NOT TESTED here: this container's systemd manages no memory controller"
    return 0
  fi
  out=$(run_code "$1" pkg-cgroup 'print("in a cgroup")')
  [ "$(field "$out" 'd["status"]')" = ok ] || fail "with cgroup = $parent the run answered: $out"
  pid=$(pgrep -n -u codexec-kernel -f ipykernel) || fail "no kernel after the run"
  line=$(grep -E '^[0-9]+:([^:]*,)?memory(,[^:]*)?:|^0::' "/proc/$pid/cgroup" | head -1)
  case "$line" in
    *"/$parent/k-"*) ;;
    *) fail "the newest kernel is not in a cgroup below $parent: $line" ;;
  esac
  if [ "${line%%:*}" = 0 ]; then  # cgroup v2
    mem=$(cat "/sys/fs/cgroup${line##*:}/memory.max" 2>/dev/null || true)
  else
    mem=$(cat "/sys/fs/cgroup/memory${line##*:}/memory.limit_in_bytes" 2>/dev/null || true)
  fi
  [ "$mem" = 2147483648 ] || fail "the kernel's cgroup (${line##*:}) has memory limit '$mem', not 2G"
  if [ "${line%%:*}" = 0 ]; then
    local unit=/sys/fs/cgroup/system.slice/codexec-gateway.service all
    all=$(cat "$unit/kernels/memory.max")
    [ "$(cat "/sys/fs/cgroup${line##*:}/memory.oom.group")" = 1 ] &&
      [ "$all" != max ] && [ "$all" -lt "$(cat "$unit/memory.max")" ] ||
      fail "kernels/ is not below the unit's memory.max ($all) or oom.group is off"
    say "cgroups: all kernels together below the unit's MemoryMax ($all bytes), an OOM kill takes a whole sandbox"
  fi
  say "cgroups: each kernel in its own cgroup below $parent, memory limited ($([ "${line%%:*}" = 0 ] && echo "cgroup v2" || echo "cgroup v1"))"
}

phase_check() {
  local key
  say "systemd $(systemctl --version | head -1 | cut -d' ' -f2) is PID 1: $(ps -o comm= -p 1)"
  wait_for 120 "PostgreSQL did not start" runuser -u postgres -- psql -qc 'SELECT 1'
  say "docs/operations.md's database block: the role, the database, migrate, a key"
  key=$(docs_block database | tail -1)
  [[ "$key" = cx_* ]] || fail "the database block printed no key last: $key"
  systemctl is-active -q codexec.socket || fail "codexec.socket is not listening"
  [ "$(systemctl show -p ActiveState --value codexec.service)" = inactive ] &&
    [ "$(systemctl show -p NRestarts --value codexec.service)" = 0 ] ||
    fail "codexec.service ran before any request: $(systemctl show -p ActiveState -p NRestarts codexec.service)"
  say "socket activation: codexec.socket listens, codexec.service not started yet"
  wait_for 120 "codexec-gateway.service did not start" systemctl is-active -q codexec-gateway.service
  wait_for 120 "the gateway does not answer" \
    curl -fsS -o /dev/null -H "Authorization: token $(sed -n 's/^JUPYTER_TOKEN=//p' /etc/codexec/gateway.env)" \
    http://127.0.0.1:18888/api/kernelspecs

  # The package's default (a cgroup for each kernel below the gateway's
  # delegated subtree) refuses kernels where there is none to have: here,
  # as an operator of such a host does, sandbox.conf says so.
  if ! cgroups_here; then
    sed -i 's|^cgroup =.*|cgroup =|' /etc/codexec/sandbox.conf
  fi
  local out url got
  say "a run through nginx"
  out=$(run_code "$key" pkg $'open("hello.txt", "w").write("hi from the package")\nx = 6 * 7\nprint(x)')
  [ "$(field "$out" 'd["stdout_tail"].strip()')" = 42 ] || fail "the run answered: $out"
  systemctl is-active -q codexec.service || fail "the request did not start codexec.service"
  say "its artifact through nginx (x-accel)"
  url=$(field "$out" 'd["artifacts"][0]["download_url"]')
  got=$(curl -fsS -H "Authorization: Bearer $key" "http://127.0.0.1$url")
  [ "$got" = "hi from the package" ] || fail "the download gave: $got"
  check_hardening
  check_kernels_user
  check_kernel_user_reads_nothing
  check_cgroups "$key"
  check_template "$key"
  check_tenants_bounded "$key"
  check_languages "$key"
  say "/metrics (the operators' token only) shows the families operators alert on"
  local m f code
  code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1/metrics)
  [ "$code" = 403 ] || fail "/metrics without the token answered $code"
  m=$(curl -fsS -H "Authorization: Bearer $(codexec-admin --config /etc/codexec/codexec.conf metrics-token)" \
    http://127.0.0.1/metrics)
  for f in 'codexec_runs_total{status="ok"}' codexec_run_duration_seconds_count codexec_sessions \
           codexec_kernels codexec_capture_bytes_total codexec_download_bytes_total; do
    printf '%s\n' "$m" | grep -q "^$f" || fail "no $f in /metrics"
  done
  check_logrotate "$key"
  check_restarts "$key"
  check_edge_link "$key"
  say ok
}

# A signed link, checked by nginx's link module and its file served from
# storage with codexec stopped: nobody else could have answered.
check_edge_link() {
  local key=$1 out aid link got
  say "a signed link, checked and served by nginx itself (codexec stopped)"
  out=$(run_code "$key" pkg-link $'open("edge.txt", "w").write("served at the edge")')
  aid=$(field "$out" 'd["artifacts"][0]["artifact_id"]')
  out=$(curl -fsS -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d '{"expires_in": 600}' "http://127.0.0.1/v1/artifacts/$aid/links") ||
    fail "no link made"
  link=$(field "$out" 'd["url"]')
  systemctl stop codexec.socket codexec.service
  got=$(curl -fsS --max-time 10 "http://127.0.0.1$link") || got="(no answer)"
  systemctl start codexec.socket
  [ "$got" = "served at the edge" ] || fail "the signed link with codexec stopped gave: $got"
}

# verify-host (packaging/quickstart) drives a VM through this agent: the
# host writes commands into a shared directory (9p, tag "verify"), one file
# each (cmd.N); the agent runs them in order as root, across reboots, and
# answers with out.N and rc.N. "reboot" and "poweroff" are answered first.
install_agent() {
  systemctl disable -q codexec-package-test.service
  cat >/etc/systemd/system/codexec-verify-agent.service <<EOF
[Unit]
Description=verify-host's agent (packaging/package-test.sh agent)
After=multi-user.target postgresql.service nginx.service codexec-gateway.service codexec.socket

[Service]
ExecStart=/bin/bash $here/package-test.sh agent

[Install]
WantedBy=multi-user.target
EOF
  systemctl enable -q codexec-verify-agent.service
  # the VM's network (qemu's user network, DHCP): verify-host reaches its
  # nginx from outside through a forwarded port
  printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n' >/etc/systemd/network/10-verify-host.network
  systemctl enable -q systemd-networkd.service
  echo 'verify /mnt/verify 9p trans=virtio,version=9p2000.L,nofail 0 0' >>/etc/fstab
  mkdir -p /mnt/verify
}

phase_agent() {
  local share=/mnt/verify n rc
  mountpoint -q $share || mount -t 9p -o trans=virtio,version=9p2000.L verify $share
  touch "$share/boot-$(cat /proc/sys/kernel/random/boot_id)"
  while :; do
    n=1
    while [ -e "$share/rc.$n" ]; do n=$((n + 1)); done
    while [ ! -e "$share/cmd.$n" ]; do sleep 0.2; done
    case "$(cat "$share/cmd.$n")" in
    reboot | poweroff)
      echo 0 >"$share/rc.$n"; sync; systemctl "$(cat "$share/cmd.$n")"; sleep 600 ;;
    *)
      rc=0
      (cd $here && bash -c "$(cat "$share/cmd.$n")") >"$share/out.$n" 2>&1 || rc=$?
      echo $rc >"$share/rc.$n.tmp"; mv "$share/rc.$n.tmp" "$share/rc.$n" ;;
    esac
  done
}

# While another tenant's CPU hog runs (four processes spinning: two CPUs'
# worth) in conversation $1, the share its kernel's cgroup got over 5 s:
# cpu.max holds it to one CPU, and it got most of one (a cgroup that is
# not the hog's, or a hog not yet spinning, would pass the bound alone).
check_cpu_quota() {
  local parent=/sys/fs/cgroup/system.slice/codexec-gateway.service/kernels cg="" kid="" d a b max used
  for _ in $(seq 240); do
    kid=$(runuser -u postgres -- psql -d codexec -tAc \
      "SELECT kernel_id FROM sessions WHERE conversation_id = '$1' AND kernel_id IS NOT NULL" 2>/dev/null)
    for d in "$parent"/k-*"${kid:-none}"-*; do
      # the kernel and its three forks (an idle kernel's cgroup holds one
      # process, forked from the template; three with bwrap)
      if [ -n "$kid" ] && [ "$(wc -l <"$d/cgroup.procs" 2>/dev/null || echo 0)" -ge 4 ]; then cg=$d; fi
    done
    [ -n "$cg" ] && break
    sleep 0.5
  done
  [ -n "$cg" ] || fail "no cgroup of the hog's kernel (conversation $1, kernel ${kid:-none}) with its four processes"
  sleep 2
  a=$(sed -n 's/^usage_usec //p' "$cg/cpu.stat"); sleep 5; b=$(sed -n 's/^usage_usec //p' "$cg/cpu.stat")
  max=$(cat "$cg/cpu.max")
  used=$(((b - a) / 50000))
  say "cpu: the hog's cgroup ($(basename "$cg")) used ${used}% of one CPU over 5 s (cpu.max $max)"
  [ "$used" -le 115 ] || fail "the hog used more than its cpu.max"
  [ "$used" -ge 50 ] || fail "the hog got less than half a CPU: its processes were not spinning"
}

case "${1:-}" in
install) phase_install "$2" "$3" ;;
install-agent) install_agent ;;
agent) phase_agent ;;
cpu-quota) check_cpu_quota "$2" ;;
block) docs_block "$2" ;;
check)
  rc=0
  ( phase_check ) || rc=$?
  echo "$rc" >"$here/rc"
  if [ "$rc" != 0 ]; then
    journalctl --no-pager -n 60 -u codexec.service -u codexec-gateway.service -u codexec.socket || true
  fi
  exit "$rc"
  ;;
*) echo "usage: package-test.sh install DEB MODULE-DEB | check | install-agent | agent | cpu-quota | block NAME" >&2; exit 2 ;;
esac
