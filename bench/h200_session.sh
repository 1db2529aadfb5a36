#!/usr/bin/env bash
# One device call's worth of GPU evidence for the closing note (issue #18): the confirm round trip
# through the dashboard's real message path on this host, then MoE and attention sweeps at the seed
# model's sizes. Wheels the host lacks travel in .whl/ (see the device tool's README).
#   bash bench/h200_session.sh OUT_DIR
set -uo pipefail
out=${1:?an output folder}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
python3 -c 'import torch, flashinfer; print(torch.__version__, flashinfer.__version__, torch.cuda.get_device_name())'
python3 -m worker inventory 2>&1 | tail -15 | tee "$out/inventory.txt"
timeout 300 python3 bench/confirm_roundtrip.py --probes gemm_bf16 --sweep-timeout 200 --timeout 200 \
  --json "$out/roundtrip.json" 2>&1 | tee "$out/roundtrip.txt"
# DeepSeek-V4-Flash as its config gives it (hidden 4096, 256 routed experts, top-6, expert width 2048), TP4.
cat > /tmp/dsv4.log <<'LOG'
[2026-12-01 19:00:00] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V4-Flash', tp_size=4, dtype='bfloat16', moe_runner_backend='auto')
[2026-12-01 19:00:01] config: {"hidden_size": 4096, "n_routed_experts": 256, "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128}
LOG
timeout 130 python3 -m worker sweep /tmp/dsv4.log --component moe --jit-timeout 60 --out "$out/sweep-moe.json" 2>&1 | tail -14 | tee "$out/sweep-moe.txt"
timeout 80 python3 -m worker sweep /tmp/dsv4.log --component attention --jit-timeout 40 --out "$out/sweep-attention.json" 2>&1 | tail -14 | tee "$out/sweep-attention.txt"
