#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The main job: examples/gdr_rdma_demo, a verbs program that moves GPU buffers with RDMA WRITE,
# registering them around every message with ibv_reg_mr and through libgdrcache, the two taking
# turns in short bursts so that a busy machine slows both alike, and verifying every payload (also
# after the buffer is freed and reallocated at the same address). It prints how the cache validates
# its hits (free events or BUFFER_ID queries, and why), both ways' messages per second (median and
# spread over the bursts), their registration cost, and where a message's time goes.
# Then examples/naive_gpu_verbs, a plain verbs program without libgdrcache, as it is and under
# LD_PRELOAD=libgdrcache-preload.so: the same verified payloads, registration through the cache.
#
# With an NVIDIA GPU and an RDMA device on this machine it runs here, against them. Otherwise (no
# GPU or no NIC, as on CI) it runs inside the project's VM: Debian's own kernel in QEMU with
# soft-RoCE (rdma_rxe), gdrcache.ko, a simulated NVIDIA P2P provider and a fake CUDA driver whose
# "GPU memory" is ordinary pages (see tests/vm/README.md for what is real and what is simulated).
# Usage: examples/run-demo.sh [gdr_rdma_demo options, used when running natively]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/deps.sh
# nvidia-smi can hang on a wedged driver: 60 s, then there is no usable GPU here.
smi_rc=0
timeout 60 nvidia-smi -L >/dev/null 2>&1 || smi_rc=$?
((smi_rc != 124)) || echo "nvidia-smi -L did not answer within 60 s: taken as no usable GPU"
if ((smi_rc == 0)) && [ -n "$(ibv_devices 2>/dev/null | awk 'NR > 2')" ]; then
	cmake -S . -B build/demo -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build/demo --target gdr_rdma_demo naive_gpu_verbs gdrcache_preload \
		-j"$(nproc)" >/dev/null
	build/demo/examples/gdr_rdma_demo "$@"
	echo "examples/naive_gpu_verbs, then the same under LD_PRELOAD=libgdrcache-preload.so:"
	build/demo/examples/naive_gpu_verbs
	exec env LD_PRELOAD="$PWD/build/demo/lib/libgdrcache-preload.so" GDRCACHE_STATS=1 \
		build/demo/examples/naive_gpu_verbs
fi
echo "No GPU with an RDMA device here: running the demo in the VM (soft-RoCE, simulated GPU)."
exec bash tests/vm/run --cases '10-rxe-up,40-demo,41-preload-naive'
