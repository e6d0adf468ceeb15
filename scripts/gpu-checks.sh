#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one bounded run (the CI machine has none).
#
# Usage: scripts/gpu-checks.sh OUT_DIR [PUBLIC_DIR] [SECONDS]
#
# Run from the repository root on a machine with one GPU, ddptui's dependencies importable
# (e.g. PYTHONPATH with carried wheels) and no network. In order of priority, each step bounded
# by `timeout` and the whole by SECONDS (default 420: a step that would start too late is
# skipped and says so):
#   1. the machine (nvidia-smi, torch, CUDA);
#   2. the `gpu`-marked tests;
#   3. benchmarks/bench_gpu.py (trainer, logging and NVML ratios);
#   4. the synthetic trainer at world size 1 with NCCL, AMP off / fp16 / bf16 (one GPU cannot
#      run NCCL at world size > 1: step 5 checks that ddptui refuses it in one line);
#   6. `ddptui monitor` on real NVML (plain and --json);
#   7. public scripts from PUBLIC_DIR, unmodified, copied to /tmp and run there (never from the
#      repository): karpathy/nanoGPT's train.py (bf16 and fp16, under ddptui and, for the
#      iteration time, under plain torchrun), pytorch/examples' multigpu_torchrun.py and
#      huggingface/pytorch-image-models' train.py (timm: one process, AMP, no DDP module),
#      and nanoGPT again as published, with torch.compile (no recompile in ddptui's code);
#   8. `ddptui bench` at world size 1 (nccl and gloo, AMP off/bf16/fp16);
#   9. benchmarks/bench_startup.py (a CPU benchmark; here on a quieter, larger machine).
# Everything goes to OUT_DIR/gpu-checks.log; run directories to OUT_DIR/runs.tgz.
set -u
out=${1:?usage: scripts/gpu-checks.sh OUT_DIR [PUBLIC_DIR] [SECONDS]}
pub=${2:-}
budget=${3:-420}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/gpu-checks.log"
work=$(mktemp -d /tmp/gpu-checks.XXXXXX)
runs="$work/runs"
mkdir -p "$runs"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
begin=$(date +%s)
ddptui=(python3 -m ddptui.console)

# step NAME NEEDS_S LIMIT_S CMD...: CMD bounded to LIMIT_S, skipped when less than NEEDS_S of the
# budget is left; its whole output into the log, its last lines on stdout.
step() {
    local name=$1 needs=$2 limit=$3
    shift 3
    local left=$((budget - ($(date +%s) - begin)))
    if ((left < needs)); then
        echo "=== $name: skipped, ${left} s of the budget left (needs ${needs} s)" | tee -a "$log"
        return
    fi
    ((limit > left)) && limit=$left
    local start
    start=$(date +%s)
    echo "=== $name: $*" >>"$log"
    timeout -k 5 "$limit" "$@" >>"$log.part" 2>&1
    local rc=$?
    cat "$log.part" >>"$log"
    echo "=== $name: rc $rc in $(($(date +%s) - start)) s"
    tail -n "${TAIL:-8}" "$log.part"
    rm -f "$log.part"
    echo "=== $name: rc $rc in $(($(date +%s) - start)) s" >>"$log"
}

# A run's summary line for the log: state, samples/s, AMP, backend, device.
summary() {
    python3 - "$@" <<'EOF'
import json, sys
for d in sys.argv[1:]:
    try:
        s = json.load(open(f"{d}/summary.json"))
    except OSError as e:
        print(d, "no summary:", e); continue
    keep = ("outcome", "exit_code", "samples", "samples_per_s", "final_accuracy", "duration_s", "diagnoses")
    print(d.rsplit("/", 1)[-1], {k: s.get(k) for k in keep if k in s})
EOF
}

TAIL=20 step machine 5 60 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c "import torch, torch.distributed as d; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0), \"nccl\", d.is_nccl_available() and torch.cuda.nccl.version())"; nproc'

TAIL=25 step gpu-tests 60 200 python3 -m pytest -m gpu -o addopts= -p no:cacheprovider -n 4 \
    --dist loadgroup -ra -q --timeout 150 --ignore tests/test_tui_snapshots.py tests

TAIL=20 step bench-gpu 60 150 python3 benchmarks/bench_gpu.py

for amp in off fp16 bf16; do
    step "synthetic-nccl-ws1-amp-$amp" 30 90 "${ddptui[@]}" --no-ui --trainer synthetic \
        --device cuda --backend nccl --world-size 1 --amp "$amp" --epochs 3 \
        --run-dir "$runs/synthetic-$amp"
done
summary "$runs"/synthetic-* >>"$log" && summary "$runs"/synthetic-*

step nccl-ws2-refused 10 60 "${ddptui[@]}" --no-ui --trainer synthetic --device cuda \
    --backend nccl --world-size 2 --epochs 1 --run-dir "$runs/ws2"

TAIL=14 step monitor 10 30 "${ddptui[@]}" monitor --no-ui --count 2 --interval 0.5
TAIL=3 step monitor-json 10 30 "${ddptui[@]}" monitor --no-ui --json --count 1

if [[ -n $pub && -d $pub ]]; then
    cp -r "$pub" "$work/pub"
    ng="$work/pub/nanogpt"
    ngargs=(config/train_shakespeare_char.py --compile=False --max_iters=300 --eval_interval=150
        --eval_iters=20 --log_interval=50 --always_save_checkpoint=False)
    for dtype in bfloat16 float16; do
        (cd "$ng" && TAIL=12 step "nanogpt-ddptui-$dtype" 60 120 "${ddptui[@]}" --no-ui \
            --script train.py --world-size 1 --run-dir "$runs/nanogpt-$dtype" -- \
            "${ngargs[@]}" --dtype=$dtype --out_dir="$work/ng-$dtype")
    done
    (cd "$ng" && TAIL=12 step nanogpt-plain-torchrun-bfloat16 40 120 python3 -m torch.distributed.run \
        --standalone --nproc-per-node 1 train.py "${ngargs[@]}" --dtype=bfloat16 \
        --out_dir="$work/ng-plain")
    summary "$runs"/nanogpt-* >>"$log" && summary "$runs"/nanogpt-*
    tut="$work/pub/tut/distributed/ddp-tutorial-series"
    (cd "$tut" && step tutorial-multigpu_torchrun 40 90 "${ddptui[@]}" --no-ui \
        --script multigpu_torchrun.py --world-size 1 --run-dir "$runs/tutorial" -- 5 2)
    summary "$runs"/tutorial >>"$log" && summary "$runs"/tutorial
    # huggingface/pytorch-image-models' train.py (unmodified; its own copy of timm, and its
    # pyyaml, huggingface_hub and safetensors as wheels in PUBLIC_DIR/timmwhl) on an image
    # folder (PUBLIC_DIR/imgdata), one process: no DDP module, so its loss reaches ddptui
    # through a pinned copy (every step must carry one).
    timm="$work/pub/timm"
    if [[ -d $timm && -d $work/pub/imgdata ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target "$work/timmsite" "$work/pub"/timmwhl/*.whl >>"$log" 2>&1
        targs=(--data-dir "$work/pub/imgdata" --model resnet18 --device cuda --amp -b 16
            --epochs 4 --workers 2 --img-size 128 --num-classes 2 --log-interval 1
            --no-prefetcher --output "$work/timm-out")
        (cd "$timm" && PYTHONPATH="$PYTHONPATH:$work/timmsite:$timm" TAIL=6 step timm-ddptui-amp \
            40 90 "${ddptui[@]}" --no-ui --script train.py --world-size 1 \
            --run-dir "$runs/timm" -- "${targs[@]}")
        summary "$runs"/timm >>"$log" && summary "$runs"/timm
        python3 - "$runs/timm/events.jsonl" <<'EOF' | tee -a "$log"
import json, sys
steps = [e for e in map(json.loads, open(sys.argv[1])) if e.get("kind") == "step"]
print(f"timm: {len(steps)} steps, {sum(e.get('loss') is not None for e in steps)} with a loss")
EOF
    fi
    # nanoGPT as published compiles its model (torch.compile, inductor, then DDP around it
    # when under DDP); ddptui's hooks must stay out of the compiled code: no recompile names
    # ddptui, and the run finishes with its steps.
    (cd "$ng" && TORCH_LOGS=recompiles TAIL=12 step nanogpt-ddptui-compile 90 180 \
        "${ddptui[@]}" --no-ui --script train.py --world-size 1 \
        --run-dir "$runs/nanogpt-compile" -- config/train_shakespeare_char.py --compile=True \
        --max_iters=300 --eval_interval=150 --eval_iters=20 --log_interval=50 \
        --always_save_checkpoint=False --dtype=bfloat16 --out_dir="$work/ng-compile")
    summary "$runs"/nanogpt-compile >>"$log" && summary "$runs"/nanogpt-compile
    grep -h "Recompiling function" "$runs"/nanogpt-compile/rank-*.log 2>/dev/null |
        sed 's/.*Recompiling function/recompiling/' | sort | uniq -c | tee -a "$log"
fi

TAIL=16 step bench-ws1 90 150 "${ddptui[@]}" bench --no-ui --trainer synthetic --world-size 1 \
    --backend nccl,gloo --amp off,bf16,fp16 --steps 150 --until-stable 10 \
    --bench-dir "$runs/bench"

TAIL=30 step bench-startup 90 150 python3 benchmarks/bench_startup.py --rounds 5

tar -czf "$out/runs.tgz" -C "$work" runs 2>/dev/null
echo "=== done in $(($(date +%s) - begin)) s of $budget" | tee -a "$log"
