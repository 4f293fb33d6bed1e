#!/bin/sh
# SPDX-License-Identifier: MIT
# UCX unchanged under LD_PRELOAD=libgdrcache-preload.so (issue 12 item 3): Debian's ucx_perftest,
# both ends in the guest over rxe0 (UCX_NET_DEVICES=rxe0:1, UCX_TLS=rc,self), a put bandwidth
# test (ucp_put_bw) and a tag latency test (tag_lat), each without and with the preload in both
# processes. Host memory: the preload passes UCX's registrations through. Both runs must succeed,
# report the same iterations, print no error or warning, and the preloaded one must have been loaded.
# vm-timeout: 240
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
[ -f "$PRELOAD" ] || { echo "libgdrcache-preload.so not built"; exit 77; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest (ucx-utils) not in the guest"; exit 77; }
export UCX_NET_DEVICES=$GDR_VM_RXE_DEV:1 UCX_TLS=rc,self UCX_IB_GID_INDEX=0
export UCX_WARN_UNUSED_ENV_VARS=n
# The iterations column of the final row ("Final:" on the client's last line).
final() { awk '/Final:/ { print $2; ok = $2 > 0 } END { exit !ok }' "$1"; }
fail=0
for t in "ucp_put_bw -s 65536 -n 200" "tag_lat -s 8 -n 1000"; do
	name=${t%% *}
	# shellcheck disable=SC2086 # $t is split on purpose
	vm-server-client 13337 ucx_perftest -p 13337 -t $t >"$name-plain.out" 2>&1 ||
		{ cat "$name-plain.out"; echo "$name without the preload: failed"; fail=1; continue; }
	cat "$name-plain.out"
	without=$(final client.log) || { echo "$name without the preload: no Final row"; fail=1; continue; }
	# shellcheck disable=SC2086
	LD_PRELOAD=$PRELOAD GDRCACHE_STATS=1 vm-server-client 13337 ucx_perftest -p 13337 -t $t \
		>"$name-preload.out" 2>&1 ||
		{ cat "$name-preload.out"; echo "$name with the preload: failed"; fail=1; continue; }
	cat "$name-preload.out"
	with=$(final client.log) || { echo "$name with the preload: no Final row"; fail=1; continue; }
	[ "$with" = "$without" ] || { echo "$name: iterations differ: $without / $with"; fail=1; }
	for end in server client; do
		grep -Eq 'gdrcache-preload\[[0-9]+\] stats: .*passthrough_host [1-9]' $end.log ||
			{ echo "$name $end: the preload was not loaded or saw no registration"; fail=1; }
	done
	if grep -Eiq 'error|warn' "$name-plain.out" "$name-preload.out"; then
		echo "$name: an error or warning line"; fail=1
	fi
	echo "ucx_perftest $name: $without iterations without and with the preload"
done
exit $fail
