#!/bin/bash
# SPDX-License-Identifier: MIT
# tests/apt.sh's gdr_apt against a fake apt-get on PATH (no package is installed, nothing real is
# locked): a lock another process holds is waited for and the call then succeeds; a lock held past
# GDR_APT_LOCK_TIMEOUT fails within it, naming the lock; any other failure is tried exactly once
# more; apt-get gets -o DPkg::Lock::Timeout and DEBIAN_FRONTEND=noninteractive.
set -uo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
# The fake: fails with $FAKE_MSG for the first $FAKE_FAILS calls, then succeeds; logs each call.
cat >"$tmp/bin/apt-get" <<'FAKE'
#!/bin/bash
n=$(($(cat "$FAKE_STATE" 2>/dev/null || echo 0) + 1))
echo "$n" >"$FAKE_STATE"
echo "call $n: DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >>"$FAKE_LOG"
if ((n <= FAKE_FAILS)); then
	echo "$FAKE_MSG" >&2
	exit 100
fi
echo "fake apt-get: done"
FAKE
chmod +x "$tmp/bin/apt-get"
export PATH="$tmp/bin:$PATH" FAKE_STATE="$tmp/state" FAKE_LOG="$tmp/log"
export GDR_APT_LOCK_POLL=1 GDR_APT_RETRY_SLEEP=0
# shellcheck source=tests/apt.sh
. "$src/tests/apt.sh"
fails=0
t=0
ok() { t=$((t + 1)); echo "ok $t - $*"; }
not_ok() { t=$((t + 1)); fails=$((fails + 1)); echo "not ok $t - $*"; sed 's/^/#   /' "$FAKE_LOG"; }
reset() { rm -f "$FAKE_STATE" "$FAKE_LOG"; touch "$FAKE_LOG"; }
lockmsg='E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)'

reset
FAKE_FAILS=3 FAKE_MSG=$lockmsg GDR_APT_LOCK_TIMEOUT=60 gdr_apt update >/dev/null 2>"$tmp/err"
rc=$?
calls=$(cat "$FAKE_STATE")
if ((rc == 0 && calls == 4)); then ok "a held lists lock: waited, 4th call succeeded"
else not_ok "a held lists lock: rc $rc after $calls calls (want 0 after 4)"; fi
if grep -q 'DEBIAN_FRONTEND=noninteractive -o DPkg::Lock::Timeout=[0-9]* update' "$FAKE_LOG"; then
	ok "apt-get ran noninteractive with DPkg::Lock::Timeout"
else not_ok "apt-get's arguments"; fi

reset
start=$SECONDS
FAKE_FAILS=1000 FAKE_MSG=$lockmsg GDR_APT_LOCK_TIMEOUT=3 gdr_apt install -y x >/dev/null 2>"$tmp/err"
rc=$?
took=$((SECONDS - start))
if ((rc != 0 && took <= 10)) && grep -q 'still held after 3s (GDR_APT_LOCK_TIMEOUT).*lists/lock' "$tmp/err"; then
	ok "a lock never freed: failed after ${took}s, naming it"
else not_ok "a lock never freed: rc $rc after ${took}s; $(tail -1 "$tmp/err")"; fi

# downloads FAILS WANT_RC WANT_CALLS TEXT: a download that breaks FAILS times in a row.
downloads() {
	reset
	FAKE_FAILS=$1 FAKE_MSG='E: Failed to fetch http://deb.debian.org/x.deb  Connection reset' \
		gdr_apt install -y x >/dev/null 2>"$tmp/err"
	local rc=$? calls
	calls=$(cat "$FAKE_STATE")
	if ((rc == $2 && calls == $3)); then ok "$4"
	else not_ok "$4: rc $rc after $calls calls (want $2 after $3)"; fi
}
downloads 1 0 2 "a broken download: tried once more, succeeded"
downloads 5 100 2 "two broken downloads: apt-get's status (100) after 2 calls"

reset
out=$(FAKE_FAILS=0 gdr_apt install -y x 2>/dev/null)
if [[ $out == "fake apt-get: done" ]]; then ok "apt-get's stdout reaches the caller's stdout"
else not_ok "stdout: '$out'"; fi

echo "$((t - fails)) passed, $fails failed"
((fails == 0))
