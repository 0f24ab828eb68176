#!/usr/bin/env bash
# Runs one Strata daemon for scripts/launch.sh and records how it ended, as
# systemd does for a unit: launch.sh's supervision restarts a daemon that
# failed (Restart=on-failure) from what this leaves behind.
#
#   run-daemon.sh PIDFILE EXITFILE LOG COMMAND...
#
# Starts COMMAND with its output appended to LOG, writes its pid to PIDFILE
# (atomically), waits for it and writes its exit status to EXITFILE
# (128 + N when signal N ended it). Signals to this wrapper are ignored:
# they are for the daemon, whose pid launch.sh uses.
set -u
pidfile="$1" exitfile="$2" log="$3"
shift 3
rm -f "$exitfile"
trap '' TERM INT HUP
"$@" >> "$log" 2>&1 < /dev/null &
pid=$!
echo "$pid" > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
wait "$pid"
echo "$?" > "$exitfile.tmp" && mv "$exitfile.tmp" "$exitfile"
