#!/usr/bin/env bash
# systemd-analyze verify on the units (system and user), ExecStart pointing at a stand-in binary;
# usage: systemd_verify.sh GENERATED_UNITS_DIR SOURCE_SYSTEMD_DIR
set -euo pipefail
units="$1" src="$2"
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found: skipped"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# verify exits 0 on lines it ignores (unknown keys, bad values), so any output fails the check.
check() {
  local label="$1" out
  shift
  if ! out="$("$@" 2>&1)"; then echo "$label: verify failed"; echo "$out"; return 1; fi
  if [ -n "$out" ]; then echo "$label: verify warned"; echo "$out"; return 1; fi
  echo "$label: ok"
}

check "system units" systemd-analyze verify "$units/tandemd.service" "$units/tandemd.socket"
# A user manager needs a runtime dir (%t); systemd does not run as PID 1 here, and need not.
mkdir -p "$tmp/run"
XDG_RUNTIME_DIR="$tmp/run" check "user units" \
  systemd-analyze --user verify "$units/user/tandemd.service" "$units/user/tandemd.socket"

# The check itself notices a broken unit.
mkdir -p "$tmp/broken"
cp "$units/tandemd.service" "$units/tandemd.socket" "$tmp/broken/"
sed -i 's/^Type=notify$/Type=notifyy/' "$tmp/broken/tandemd.service"
if check "broken unit" systemd-analyze verify "$tmp/broken/tandemd.service" >/dev/null; then
  echo "a unit with a bad Type= passed verify"
  exit 1
fi

# The checked-in units say what a package installs and what the daemon relies on.
need() { grep -qx -- "$2" "$src/$1" || { echo "$1 lacks: $2"; exit 1; }; }
need tandemd.service 'ExecStart=/usr/bin/tandemd --config /etc/tandem/tandemd.conf'
need tandemd.service 'Type=notify'
need tandemd.service 'NotifyAccess=main'
need tandemd.service 'Restart=on-failure'
need tandemd.service 'User=tandem'
need tandemd.service 'RuntimeDirectory=tandem'
need tandemd.service 'DevicePolicy=closed'
need tandemd.service 'MemoryDenyWriteExecute=no'
need tandemd.socket 'ListenStream=/run/tandem/tandem.sock'
need tandemd.socket 'SocketMode=0660'
need tandemd.socket 'SocketGroup=tandem'
need user/tandemd.socket 'ListenStream=%t/tandem/tandem.sock'
grep -q '^WatchdogSec=' "$src/tandemd.service" || { echo "tandemd.service lacks WatchdogSec"; exit 1; }
# Bounded: a runaway request cannot take the machine (MemoryHigh below MemoryMax).
for unit in tandemd.service user/tandemd.service; do
  need "$unit" 'MemoryHigh=80%'
  need "$unit" 'MemoryMax=90%'
  need "$unit" 'TasksMax=4096'
done

# The system unit's sandbox: systemd's own exposure score stays at 1.5 or less.
if score="$(systemd-analyze security --offline=yes "$units/tandemd.service" 2>/dev/null |
            sed -n 's/.*Overall exposure level for tandemd.service: \([0-9.]*\).*/\1/p')" && [ -n "$score" ]; then
  awk -v s="$score" 'BEGIN { exit !(s <= 1.5) }' || { echo "systemd-analyze security: exposure $score, over 1.5"; exit 1; }
  echo "systemd-analyze security: exposure $score"
else
  echo "systemd-analyze security --offline not available: exposure not checked"
fi

# test_daemon_config checks that the sample config names every key the parser knows.
echo "unit contents: ok"

# The system calls the worker split makes (fork/exec of workers, pidfds, memfd channels,
# eventfds, close_range, the parent-death signal, flock on the pool, AMX permission) pass
# the unit's filter: allowed by @system-service, not denied by the ~ groups.
expand() {
  systemd-analyze syscall-filter "$1" 2>/dev/null | sed -n '/^@/,$p' | tail -n +2 | grep -v '^ *#' |
    awk '{print $1}' | while read -r x; do
      [[ -z "$x" ]] && continue
      if [[ "$x" == @* ]]; then expand "$x"; else echo "$x"; fi
    done
}
allowed="$(expand @system-service | sort -u)"
if [[ -z "$allowed" ]]; then
  echo "systemd-analyze cannot list syscall groups: filter check skipped"
  exit 0
fi
denied="$(for g in $(grep '^SystemCallFilter=~' "$src/tandemd.service" | sed 's/^SystemCallFilter=~//'); do expand "$g"; done | sort -u)"
for sc in clone3 execve pidfd_open memfd_create eventfd2 close_range prctl flock ftruncate mmap madvise poll \
          kill arch_prctl; do
  grep -qx "$sc" <<<"$allowed" || { echo "the unit's SystemCallFilter does not allow $sc"; exit 1; }
  if grep -qx "$sc" <<<"$denied"; then echo "the unit's SystemCallFilter denies $sc"; exit 1; fi
done
echo "system calls of the worker split: allowed"
