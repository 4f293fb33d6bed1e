# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Sourced (bash): gdr_apt, apt-get made to wait for the locks something else holds (unattended
# upgrades, apt-daily, a second test run) and to survive one flaky download.
#
#   gdr_apt [--timeout SECONDS] APT-GET-ARGUMENTS...     e.g. gdr_apt update; gdr_apt install -y x
#
# - DEBIAN_FRONTEND=noninteractive, and -o DPkg::Lock::Timeout: apt-get itself waits for the dpkg
#   locks (/var/lib/dpkg/lock-frontend, lock) before it installs.
# - apt 2.6 (Debian 12) does not wait for the other locks: `update` fails at once on the lists lock
#   (/var/lib/apt/lists/lock), a download on the archives lock (/var/cache/apt/archives/lock), with
#   "Could not get lock ... It is held by process N". Such a failure is tried again every
#   GDR_APT_LOCK_POLL seconds (default 10).
#   All lock waits together end GDR_APT_LOCK_TIMEOUT seconds (default 600) after the call began;
#   then it fails, saying which lock was still held.
# - Any other failure (a download that broke off, a mirror in mid-sync) is tried once more, after
#   GDR_APT_RETRY_SLEEP seconds (default 15); a second such failure is the result.
# - --timeout SECONDS: each attempt runs under timeout(1) (for fetches into private directories
#   only: never around an apt-get that runs dpkg).
# Exit status: apt-get's (124 for an attempt past --timeout).
gdr_apt() {
	local - limit="" start=$SECONDS lock_to=${GDR_APT_LOCK_TIMEOUT:-600}
	local retry_sleep=${GDR_APT_RETRY_SLEEP:-15} poll=${GDR_APT_LOCK_POLL:-10}
	local retried=0 noted=-1 rc left err
	set +e
	if [[ ${1-} == --timeout ]]; then
		limit=${2:?gdr_apt: --timeout needs seconds}
		shift 2
	fi
	err=$(mktemp "${TMPDIR:-/tmp}/gdr-apt.XXXXXX") || return 1
	while :; do
		left=$((start + lock_to - SECONDS))
		((left > 0)) || left=1
		# stderr shown as it comes and kept in $err; stdout where the caller sent it.
		{
			if [[ -n $limit ]]; then
				DEBIAN_FRONTEND=noninteractive timeout -k 10 "$limit" \
					apt-get -o DPkg::Lock::Timeout="$left" "$@" 2>&1 1>&3 3>&-
			else
				DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$left" "$@" 2>&1 1>&3 3>&-
			fi | tee "$err" >&2
			rc=${PIPESTATUS[0]}
		} 3>&1
		((rc == 0)) && break
		if grep -q -e 'Could not get lock' -e 'is another process using it' "$err"; then
			if ((SECONDS - start >= lock_to)); then
				echo "[apt] error: apt-get $*: a lock was still held after ${lock_to}s" \
					"(GDR_APT_LOCK_TIMEOUT): $(grep -m 1 -E 'Could not get lock|is another process' "$err")" >&2
				break
			fi
			if ((noted < 0 || SECONDS - noted >= 60)); then
				echo "[apt] apt-get $*: an apt/dpkg lock is held by another process; trying again" \
					"every ${poll} s, $((start + lock_to - SECONDS))s left" >&2
				noted=$SECONDS
			fi
			left=$((start + lock_to - SECONDS))
			sleep $((left < poll ? (left > 0 ? left : 1) : poll))
			continue
		fi
		if ((retried)); then
			echo "[apt] error: apt-get $* failed again (exit $rc)" >&2
			break
		fi
		retried=1
		echo "[apt] apt-get $* failed (exit $rc): trying once more in ${retry_sleep}s" >&2
		sleep "$retry_sleep"
	done
	rm -f "$err"
	return "$rc"
}
