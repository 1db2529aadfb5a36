#!/usr/bin/env bash
# Build a CPU-only SGLang venv (sglang 0.5.23, torch 2.13.0+cpu) outside the repo.
#
#   bench/sglang_cpu_env.sh TARGET_DIR          e.g. bench/sglang_cpu_env.sh /work/sglang-env
#
# Then (tiny model, dummy weights, nothing downloaded at run time):
#   HF_HUB_OFFLINE=1 TARGET_DIR/bin/python -m sglang.launch_server \
#       --model-path bench/sglang_cpu/tiny-llama --device cpu --load-format dummy \
#       --host 127.0.0.1 --port 30000 --max-total-tokens 65536
#
# What it does: python3.11 -m venv TARGET_DIR; pip install torch==2.13.0+cpu (the wheel on this
# disk, /opt/wheels); pip install --no-deps -r bench/sglang_cpu/requirements.txt (exact pins);
# installs bench/sglang_cpu/sglang_cpu_tvshim.py + a .pth hook into site-packages (lets PyPI's
# CUDA torchvision import beside the CPU torch); checks the imports SGLang needs.
# Idempotent-ish: if TARGET_DIR holds a finished install of the same pins (stamp file with the
# hash of the requirements, the shim and this script) it only re-checks and exits.
# Env: PYTHON (default python3.11).
set -euo pipefail

TARGET=${1:?usage: $0 TARGET_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D="$HERE/sglang_cpu"
REQ="$D/requirements.txt"
SHIM="$D/sglang_cpu_tvshim.py"
PYTHON=${PYTHON:-python3.11}
SGLANG_PIN=$(sed -n 's/^sglang==//p' "$REQ")
TORCH_PIN=2.13.0+cpu
STAMP="$TARGET/.sglang-cpu-env.stamp"
WANT=$(cat "$REQ" "$SHIM" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)

check() {
    # Fast check (no torch import): pinned versions present, shim hook in place.
    "$TARGET/bin/python" - "$SGLANG_PIN" "$TORCH_PIN" <<'EOF'
import sys, importlib.metadata as md, importlib.util
want_sgl, want_torch = sys.argv[1:3]
got = {p: md.version(p) for p in ("sglang", "torch", "torchvision", "vllm", "triton")}
assert got["sglang"] == want_sgl and got["torch"] == want_torch, got
assert importlib.util.find_spec("sglang_cpu_tvshim"), "shim missing"
print("sglang-cpu-env:", " ".join(f"{k}={v}" for k, v in got.items()))
EOF
}

if [[ -x "$TARGET/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && check 2>/dev/null; then
    echo "sglang-cpu-env: $TARGET already has sglang==$SGLANG_PIN (stamp $WANT); nothing to do"
    exit 0
fi

# pip's local mirrors print one warning per package they do not hold: drop that noise only.
pipq() {
    "$TARGET/bin/python" -m pip --disable-pip-version-check "$@" 2>&1 |
        grep -v "is ignored: it is neither a file nor a directory" || true
    return "${PIPESTATUS[0]}"
}

t0=$(date +%s)
rm -f "$STAMP"
[[ -x "$TARGET/bin/python" ]] || "$PYTHON" -m venv "$TARGET"
pipq install -q --no-deps "torch==$TORCH_PIN"
pipq install -q --no-deps -r "$REQ"

SP=$("$TARGET/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp "$SHIM" "$SP/sglang_cpu_tvshim.py"
echo "import sglang_cpu_tvshim" >"$SP/sglang_cpu_tvshim.pth"

check
# The imports a launch needs (torchvision through the shim, vllm's rotary op module, sglang's server).
if ! out=$("$TARGET/bin/python" -W ignore -c \
    'import torchvision.transforms, vllm._custom_ops, sglang.srt.entrypoints.http_server' 2>&1); then
    echo "$out" >&2
    echo "sglang-cpu-env: import check failed in $TARGET" >&2
    exit 1
fi
echo "$WANT" >"$STAMP"
echo "sglang-cpu-env: installed into $TARGET in $(($(date +%s) - t0))s, $(du -sh "$TARGET" | cut -f1)"
