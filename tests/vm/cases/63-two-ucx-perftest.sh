#!/bin/sh
# SPDX-License-Identifier: MIT
# ucx_perftest between two guests (tests/vm/run --two, issue 32): the server on node 2 (started
# over vm-ssh), the client here connecting to node 2's address, UCX over rxe0 and the link
# (UCX_TLS=rc,self): a put bandwidth test (ucp_put_bw) and a tag latency test (tag_lat), each
# without and with LD_PRELOAD=libgdrcache-preload.so in both processes. As case 50: both succeed,
# the same iterations, no error or warning, the preload loaded with registrations at both ends;
# and the traffic crossed the link.
# vm-two: yes
# vm-timeout: 300
[ "$GDR_VM_NODE" = 1 ] || { echo "not node 1 of tests/vm/run --two"; exit 77; }
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
[ -f "$PRELOAD" ] || { echo "libgdrcache-preload.so not built"; exit 77; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest (ucx-utils) not in the guest"; exit 77; }
ucx="UCX_NET_DEVICES=$GDR_VM_RXE_DEV:1 UCX_TLS=rc,self UCX_IB_GID_INDEX=0 UCX_WARN_UNUSED_ENV_VARS=n"
pre="LD_PRELOAD=$PRELOAD GDRCACHE_STATS=1"
# Bytes this guest's NIC sent and received.
rx() { s=/sys/class/net/$GDR_VM_NETDEV/statistics; echo $(($(cat "$s/tx_bytes") + $(cat "$s/rx_bytes"))); }
# The iterations column of the final row ("Final:" on the client's last line).
final() { awk '/Final:/ { print $2; ok = $2 > 0 } END { exit !ok }' "$1"; }
# perftest NAME ENV TEST...: the server on node 2, the client here; both must exit 0 (120 s each).
perftest() {
	run=$1 env=$2
	shift 2
	timeout -k 10 120 vm-ssh "$GDR_VM_PEER" "cd /tmp && env $env ucx_perftest -p 13337" \
		>"$run-server.log" 2>&1 &
	server=$!
	timeout 60 vm-ssh "$GDR_VM_PEER" /tests/bin/vm-wait-listen 13337 60 ||
		{ cat "$run-server.log"; echo "$run: the server on node 2 does not listen"; return 1; }
	# shellcheck disable=SC2086 # $env is split on purpose
	timeout -k 10 120 env $env ucx_perftest -p 13337 -t "$@" "$GDR_VM_PEER_ADDR" >"$run-client.log" 2>&1
	client_rc=$?
	vm-wait-exit "$server" 60 "the ucx_perftest server on node 2" >/dev/null
	wait "$server"
	server_rc=$?
	echo "--- $run: server on node 2 (exit $server_rc)"; cat "$run-server.log"
	echo "--- $run: client on node 1 (exit $client_rc)"; cat "$run-client.log"
	[ $server_rc = 0 ] && [ $client_rc = 0 ]
}
fail=0
for t in "ucp_put_bw -s 65536 -n 100" "tag_lat -s 8 -n 200"; do
	name=${t%% *}
	rx0=$(rx)
	# shellcheck disable=SC2086 # $t is split on purpose
	perftest "$name-plain" "$ucx" $t || { echo "$name without the preload: failed"; fail=1; continue; }
	got=$(($(rx) - rx0))
	without=$(final "$name-plain-client.log") || { echo "$name without the preload: no Final row"; fail=1; continue; }
	# shellcheck disable=SC2086
	perftest "$name-preload" "$ucx $pre" $t || { echo "$name with the preload: failed"; fail=1; continue; }
	with=$(final "$name-preload-client.log") || { echo "$name with the preload: no Final row"; fail=1; continue; }
	[ "$with" = "$without" ] || { echo "$name: iterations differ: $without / $with"; fail=1; }
	for end in server client; do
		grep -Eq 'gdrcache-preload\[[0-9]+\] stats: .*passthrough_host [1-9]' "$name-preload-$end.log" ||
			{ echo "$name $end: the preload was not loaded or saw no registration"; fail=1; }
	done
	if grep -Eiq 'error|warn' "$name"-*.log; then echo "$name: an error or warning line"; fail=1; fi
	echo "$name without the preload: $got bytes through $GDR_VM_NETDEV"
	# ucp_put_bw: 100 puts of 64 KiB into node 2; tag_lat: 200 round trips of 8 bytes.
	case $name in
	ucp_put_bw) min=6553600 ;;
	*) min=3200 ;;
	esac
	[ $got -ge $min ] || { echo "$name: the traffic did not cross the link"; fail=1; }
	echo "ucx_perftest $name between the guests: $without iterations without and with the preload"
done
exit $fail
