#!/bin/sh
# SPDX-License-Identifier: MIT
# libfabric unchanged under LD_PRELOAD=libgdrcache-preload.so: Debian's libfabric-bin (1.17) over
# rxe0 through its verbs provider, both ends in the guest at va's address. `fi_info -p verbs` must
# list rxe0; then `fi_pingpong -p verbs -e dgram` (UD; 10 pings of 64 bytes), without and with the
# preload in both processes. The client's exit status and both ends' result lines (timings aside)
# must be the same, no error or warning line, and the preload must have seen the client's
# registrations. On rxe the verbs provider's MSG endpoint (so ofi_rxm's RDM) is not usable by
# fi_pingpong (its server's fi_getinfo without a node gives -61), and a dgram server hangs in
# teardown after its results (closing its fids): it is given 2 s once the client is done, then killed.
# vm-timeout: 120
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
[ -f "$PRELOAD" ] || { echo "libgdrcache-preload.so not built"; exit 77; }
if ! command -v fi_pingpong >/dev/null || ! command -v fi_info >/dev/null; then
	echo "fi_pingpong/fi_info (libfabric-bin) not in the guest"; exit 77
fi
addr=$($IP -4 -o addr show dev "$GDR_VM_NETDEV" | sed -n 's/.* inet \([0-9.]*\)\/.*/\1/p' | head -n 1)
fail=0
fi_info -p verbs >fi_info.out 2>&1 || { cat fi_info.out; echo "fi_info -p verbs failed"; fail=1; }
grep -q "domain: $GDR_VM_RXE_DEV" fi_info.out ||
	{ cat fi_info.out; echo "fi_info -p verbs does not list $GDR_VM_RXE_DEV"; fail=1; }

# pp TAG: one server and one client; TAG.server / TAG.client hold output and the exit status.
pp() {
	tag=$1
	fi_pingpong -p verbs -e dgram -I 10 -S 64 >"$tag.server" 2>&1 &
	spid=$!
	vm-wait-listen 47592 30 ||
		echo "the $tag server does not listen on 47592 after 30 s: the client runs anyway (its 20 s bound)" >>"$tag.notes"
	timeout 20 fi_pingpong -p verbs -e dgram -I 10 -S 64 "$addr" >"$tag.client" 2>&1
	echo "exit $?" >>"$tag.client"
	i=0
	while [ $i -lt 100 ] && kill -0 $spid 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
	kill $spid 2>/dev/null && echo "server still in teardown after 10 s: killed" >>"$tag.notes"
	# SIGTERM given: 10 s more for it to go, then SIGKILL; never waited for if even that fails.
	vm-wait-exit "$spid" 10 "the $tag server" 2>>"$tag.notes"
	[ $? = 2 ] || wait $spid
}
# The result row without its timings: bytes, #sent, #ack, total.
rows() { grep -v '^gdrcache-preload\[' "$1" | awk '/^[0-9]/ { print $1, $2, $3, $4; next } { print }'; }

pp plain
LD_PRELOAD=$PRELOAD GDRCACHE_STATS=1 pp preload
for end in server client; do
	rows "plain.$end" >"plain.$end.cmp"
	rows "preload.$end" >"preload.$end.cmp"
	cmp -s "plain.$end.cmp" "preload.$end.cmp" ||
		{ echo "$end: output differs with the preload:"; diff "plain.$end.cmp" "preload.$end.cmp"; fail=1; }
	grep -Eq '^64 +10 +=10 ' "plain.$end" || { echo "$end: no result row of 10 acked pings"; fail=1; }
done
grep -q '^exit 0$' plain.client || { echo "the client failed without the preload"; fail=1; }
grep -Eq 'gdrcache-preload\[[0-9]+\] stats: .*passthrough_host [1-9]' preload.client ||
	{ echo "client: the preload was not loaded or saw no registration"; fail=1; }
if grep -Eiq 'error|warn' plain.* preload.* fi_info.out; then echo "an error or warning line"; fail=1; fi
echo "--- without the preload"; cat plain.server plain.client plain.notes 2>/dev/null
echo "--- with the preload"; cat preload.server preload.client preload.notes 2>/dev/null
row=$(grep -E '^64 ' plain.client | awk '{ print $1, $2, $3 }')
[ $fail = 0 ] && echo "fi_info -p verbs lists $GDR_VM_RXE_DEV; fi_pingpong -p verbs -e dgram ($row): the same result rows and client exit status without and with the preload"
exit $fail
