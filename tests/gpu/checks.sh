#!/usr/bin/env bash
# The checks only a GPU machine can run, in one pass (the device tool's lent machine, which has
# python3 with CUDA torch, JAX and Accelerate but no pydantic: its wheels travel in .whl/).
# Everything it prints goes to $OUT/checks.log; nvidia-smi's XML and the preflight's JSON beside it.
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform \
#     manylinux2014_x86_64 -d .whl pydantic pydantic_core pydantic-settings python-dotenv \
#     typing-inspection annotated-types        (here, once; the versions of .venv)
#   bash tests/gpu/checks.sh                    (there; CHECKS=REGEX runs only the checks it matches)
set -u
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
exec > >(tee "$OUT/checks.log") 2>&1
if ! python3 -c "import pydantic_settings" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 REPORT_DIR=/tmp/gpu-reports
mkdir -p "$REPORT_DIR"
TL=(python3 -m launcher)
trainer_env=(env PET_NNODES=1 PET_NODE_RANK=0 PET_MASTER_ADDR=localhost PET_MASTER_PORT=29511)

check() {  # check NAME COMMAND...: its output, its exit code and its termination message
  local name=$1; shift
  [[ -n ${CHECKS:-} && ! $name =~ $CHECKS ]] && return
  echo; echo "=== $name: $*"
  local started=$SECONDS
  LAUNCHER_TERMINATION_LOG=/tmp/termination-$name timeout 300 "$@"
  echo "--- $name: exit $? in $((SECONDS - started)) s"
  [ -s /tmp/termination-$name ] && { echo "--- termination message:"; cat /tmp/termination-$name; echo; }
}

date -u; uname -r; python3 --version
nvidia-smi -L
[ -z "${CHECKS:-}" ] && nvidia-smi -q -x > "$OUT/nvidia-smi-q-x.xml"
python3 -c 'import torch, jax, accelerate; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "devices", torch.cuda.device_count()); print("jax", jax.__version__, jax.devices()); print("accelerate", accelerate.__version__)'
ls -l /dev/nvidia* 2>&1 | head -5; echo "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-unset} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"

check plan-auto "${trainer_env[@]}" PET_NPROC_PER_NODE=auto "${TL[@]}" plan -- tests/programs/cuda_ranks.py
check plan-gpu "${trainer_env[@]}" PET_NPROC_PER_NODE=gpu "${TL[@]}" plan -- tests/programs/cuda_ranks.py
check smoke-quick bash -o pipefail -c "${TL[*]} smoke --json | tee $OUT/smoke-quick.json"
check smoke-long "${TL[@]}" smoke --level long
check nccl-ok "${trainer_env[@]}" PET_NPROC_PER_NODE=auto "${TL[@]}" torch -- tests/programs/cuda_ranks.py
check nccl-device-assert "${trainer_env[@]}" PET_NPROC_PER_NODE=auto CUDA_FAIL=assert "${TL[@]}" torch -- tests/programs/cuda_ranks.py
check nccl-oom "${trainer_env[@]}" PET_NPROC_PER_NODE=auto CUDA_FAIL=oom "${TL[@]}" torch -- tests/programs/cuda_ranks.py
check accelerate-bf16 "${trainer_env[@]}" PET_NPROC_PER_NODE=auto "${TL[@]}" torch --accelerate -- --mixed_precision bf16 tests/programs/accelerate_train.py
cat "$REPORT_DIR"/*.json 2>/dev/null; echo
check jax-gate env JAX_NUM_PROCESSES=1 JAX_PROCESS_ID=0 JAX_COORDINATOR_ADDRESS=localhost:29512 "${TL[@]}" jax -- python3 examples/jax_demo.py --steps 20
check jax-gpu env JAX_NUM_PROCESSES=1 JAX_PROCESS_ID=0 JAX_COORDINATOR_ADDRESS=localhost:29512 "${TL[@]}" jax --allow-untested-versions 1 -- python3 examples/jax_demo.py --steps 20
date -u
