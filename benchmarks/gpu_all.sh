#!/usr/bin/env bash
# Every GPU check in one go, each stage under its own time limit so one that breaks or hangs leaves the others'
# results: the device check (benchmarks/gpu_check.py: kernels vs torch, Qwen3-30B-A3B-shaped decode per
# configuration), then the engine's tests that run on CUDA (every family's logits vs HF transformers through the
# compiled Triton kernels, device placement + CUDA graphs vs host placement, the placement kernels vs the policies).
#   bash benchmarks/gpu_all.sh [OUT_DIR]     (default: $OUT, else ./gpu_out)
# Limits in seconds: GPU_CHECK_S (290), GPU_TESTS_S (140), GPU_PROFILE_S (60: benchmarks/decode_profile.py; 0 skips
# it); GPU_TUNE_S > 0 adds tune_kernels.py --quick into OUT_DIR/tuned_configs.json. gptq's auto-round packer is a
# test-only package: its case is left out here. At most 8 files land in OUT_DIR.
# Wheels the machine lacks (the tests' quant packers need compressed-tensors) are installed from .whl/ if present.
set -u
out=${1:-${OUT:-gpu_out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
{ nvidia-smi -L; command -v cc gcc; nproc
  python3 -c "import sys, torch, triton, numpy, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, numpy.__version__, transformers.__version__)"
} 2>&1 | tee "$out/env.txt"
t0=$SECONDS
timeout "${GPU_CHECK_S:-290}" python3 benchmarks/gpu_check.py --json "$out/gpu_check.json" ${GPU_CHECK_ARGS:-} 2>&1 \
  | tee "$out/gpu_check.log"
echo "gpu_check: rc ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
t0=$SECONDS
timeout "${GPU_TESTS_S:-140}" python3 -m pytest -p no:cacheprovider -n "${GPU_TEST_WORKERS:-4}" -rfE -k "(triton or cuda) and not gptq" \
  tests/engine/test_hf_match.py tests/engine/test_deepseek_hf_match.py tests/engine/test_deepseek_v4_hf_match.py \
  tests/engine/test_glm_minimax_hf_match.py tests/engine/test_gpt_oss_hf_match.py tests/engine/test_qwen3_next_hf_match.py \
  tests/engine/test_quant_hf_match.py tests/engine/test_decode_cuda.py tests/kernels/test_placement_cuda.py \
  >"$out/gpu_tests.log" 2>&1
echo "gpu tests: rc $? in $((SECONDS - t0)) s"
tail -25 "$out/gpu_tests.log"
if [ "${GPU_PROFILE_S:-60}" -gt 0 ]; then  # wall vs kernel time per decode token, the top kernels
  t0=$SECONDS
  timeout "${GPU_PROFILE_S:-60}" python3 benchmarks/decode_profile.py --fractions 1.0,0.37 \
    --json "$out/decode_profile.json" >"$out/decode_profile.log" 2>&1
  echo "decode_profile: rc $? in $((SECONDS - t0)) s"; grep -E "^fraction|^ +[0-9.]+ ms" "$out/decode_profile.log"
fi
if [ "${GPU_TUNE_S:-0}" -gt 0 ]; then  # the quick grid into a copy of the table (the package's file stays as it is)
  t0=$SECONDS
  cp freetoken/kernels/tuned_configs.json "$out/tuned_configs.json"
  timeout "$GPU_TUNE_S" python3 benchmarks/tune_kernels.py --quick --out "$out/tuned_configs.json" >"$out/tune.log" 2>&1
  echo "tune_kernels --quick: rc $? in $((SECONDS - t0)) s"; tail -15 "$out/tune.log"
fi
