#!/usr/bin/env bash
# The GPU check (issue 29): one prepared command that fits 9 minutes on one H100 or H200,
# the install included. Run THERE, on the lent GPU machine, from the repository root, with
# .whl/ carried from `bash bench/gpu_wheels.sh` run here. Its parts, in this order, each
# under its own time limit, each writing its log (and JSON) to $OUT (else runs/gpu_check) as
# it goes, so a run cut off still returns what it finished:
#   install  the carried wheels; jax, jaxlib, cuDNN and driver versions, the device
#   tests    the tests that only run on a GPU, each under a per-test limit (pytest-timeout)
#   default  main.py with nothing chosen on a packed GPT and a grouped-query Llama: a few
#            dozen steps each, a decode from each checkpoint, then a restart (a second
#            process) that must load its train step from the persistent compilation cache
#   speed    GPT126M at batch 8 against the PyTorch peer, Llama1B, GPT1_3B: tokens/s, MFU,
#            peak memory and XLA:GPU's planned peak (bench/gpu_bench.py's table)
#   moe      mixtures of experts on one GPU, the same table: Qwen3-30B-A3B's shape cut to 4
#            layers beside the dense Llama with a token's parameters, then Pax's GLaM126M64E;
#            MFU on a token's active parameters
#   fp8      FP8 against bfloat16 on the 5B shape cut to 8 layers: speed and both losses
#   long     (only when named: outside the 9 minutes) the attention kernels at 16384 tokens
#            (cuDNN packed, jax's Pallas, the context axis's kernels: Pallas by positions and
#            plain-JAX flash), then the longest sequence that trains on one GPU: Llama 3.1
#            8B's shape cut to 4 layers at 65536 and 131072 tokens
# A part may also use the seconds that the parts before it left unused, so the whole run
# stays within the sum of the budgets. The last lines are a summary table (part, status,
# key figure), also in $OUT/summary.txt; the exit status is non-zero when a part failed or
# ran out of time. `--dry-run` checks here, on CPU, that every command line of the chosen
# parts is valid (main.py with --print_config, gpu_bench.py with --dry_run, pytest with
# --collect-only) and prints the budgets.
#
#   bash bench/gpu_check.sh                        # every part but long
#   bash bench/gpu_check.sh --parts install,speed  # again, one part (install: a fresh machine)
#   bash bench/gpu_check.sh --parts install,long   # a second short run: the long part
#   GPU_CHECK_PARTS=fp8 bash bench/gpu_check.sh --budget fp8=200   # one part, more time
#   bash bench/gpu_check.sh --dry-run              # here: valid command lines, budgets
set -uo pipefail  # not -e: a part that fails is recorded and the parts after it still run

PARTS=(install tests default speed moe fp8 long)
# Parts that run only when --parts names them: a second short run, after the 9 minutes.
OPTIONAL_PARTS=(long)
# Seconds per part, estimated from what each part runs on one H100 (earlier figures: install
# ~20 s, a jax start ~10 s, GPT126M's train step compiles in 30-37 s, GPT1_3B's in 69 s);
# docs/guides/gpu_check.md shows the estimate behind each. moe's 100 s are 50 of fp8's
# (100 before), the 20 the total left unused, 15 of speed's (whose third row was already
# the one to lose) and 5 of each other part: fp8, last, runs on its 50 and what the others
# leave, and is the part to rerun (--parts fp8).
# long: the kernels (a jax start, 4 kernels x 2 row kinds, each a compile and 6 calls of
# at most ~0.1 s: ~60 s), then two rows, each a jax start (~15 s), a compile (40-70 s) and
# 4 steps (at 40% MFU, planned 4 s each at 65536 tokens, ~16 s at 131072 with
# recomputation): 155-220 s, or less where the second row stops at out of memory.
declare -A BUDGET=([install]=25 [tests]=125 [default]=95 [speed]=145 [moe]=100 [fp8]=50
                   [long]=300)
MAX_TOTAL_S=540  # 9 minutes: a 10-minute device command with room for its start
# Every test file that runs only on a GPU (a skip off GPUs, or cases under ON_GPU);
# tests/test_gpu_check.py checks that none is missing.
GPU_TESTS=(tests/test_attention.py tests/test_flash_pallas.py tests/test_fused_training.py)
TEST_LIMIT_S=60  # per test; the longest is a pair of 10-step trainings
SITE=/tmp/paxloom-site  # where the carried wheels go, beside the machine's own jax
MAIN_FLAGS=("--fdl.ICI_MESH_SHAPE=[1,1,1]")  # one GPU; everything else as the experiment says
DEFAULT_STEPS=30
BENCH_STEPS=(--steps 10 --warmup 2)

# run LOG ARGS...: "$PYTHON" ARGS within what is left of the part's time, its output shown
# and appended to $out/LOG as it comes. In a dry run, ARGS are only validated (validate).
run() {
    local log=$1 left rc
    shift
    if ((dry_run)); then
        validate "$@"
        return
    fi
    left=$((deadline - SECONDS))
    if ((left <= 0)); then
        timed_out=1
        return 124
    fi
    echo "+ python3 $*" | tee -a "$out/$log"
    # -k: a process that ignores SIGTERM (a hung kernel) is killed 10 s later.
    timeout -k 10 "$left" "$PYTHON" "$@" 2>&1 | tee -a "$out/$log"
    rc=${PIPESTATUS[0]}
    if ((rc == 124 || rc == 137)); then
        timed_out=1
    fi
    return "$rc"
}

# validate ARGS...: run ARGS with the flag that makes each script check its command line
# and stop before touching a GPU; on failure, print the line and the end of its output.
validate() {
    local check=()
    case "$1 ${2:-}" in
        "main.py "*) check=(--print_config) ;;
        "bench/gpu_bench.py "* | "bench/attention_kernels.py "*) check=(--dry_run) ;;
        "-m pytest") check=(--collect-only -q) ;;
    esac  # anything else (gpu_check_figures.py versions) runs as it is: it is quick on CPU
    local log
    log=$(mktemp "$work/validate.XXXXXX")  # the parts' dry runs go side by side
    if ! "$PYTHON" "$@" "${check[@]}" >"$log" 2>&1; then
        echo "    invalid: python3 $* ${check[*]}"
        tail -n 5 "$log" | sed 's/^/      /'
        return 1
    fi
}

part_install() {
    local wheels=(.whl/*.whl)
    if ((dry_run)); then
        echo "    (pip runs there only: the wheels are for Python 3.12 on x86-64 Linux)"
    elif [[ ! -e ${wheels[0]} ]]; then
        echo "no .whl/: run 'bash bench/gpu_wheels.sh' where PyPI is reachable and carry .whl/" \
            | tee -a "$out/install.log"
        return 1
    else
        run install.log -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$SITE" "${wheels[@]}" || return
    fi
    run install.log bench/gpu_check_figures.py versions
}

part_tests() {
    local limit=() platform=cuda
    # The tests pick the CPU unless told (tests/conftest.py); a dry run collects them there.
    if ((dry_run)); then
        platform=cpu
    fi
    if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then
        limit=(--timeout="$TEST_LIMIT_S")
    else
        echo "    pytest-timeout is not installed: no per-test limit, only the part's" \
            "(bash bench/gpu_wheels.sh carries it)"
    fi
    JAX_PLATFORMS=$platform run tests.log -m pytest -q -rfEs -p no:cacheprovider \
        "${limit[@]}" "${GPU_TESTS[@]}"
}

part_default() {
    local family dir rc=0
    # Checkpoints and the cache stay out of $OUT, which should come back small.
    local cache=(--jax_compilation_cache_dir="$work/jax_cache")
    for family in Tiny LlamaTiny; do  # a packed GPT; a grouped-query Llama (4 heads, 2 KV)
        dir=$work/$family
        run default.log main.py --fdl_config="experiments.$family" "${MAIN_FLAGS[@]}" \
            --fdl.MAX_STEPS="$DEFAULT_STEPS" --job_log_dir="$dir" "${cache[@]}" \
            && run default.log main.py --fdl_config="experiments.$family" "${MAIN_FLAGS[@]}" \
                --mode=decode --prompt="The list" --max_decode_steps=16 --job_log_dir="$dir" \
                "${cache[@]}" \
            || rc=1
    done
    # A second process resumes the GPT for a few more steps: the same train step, which it
    # must load from the cache (gpu_check_figures.py key default checks its log line).
    run default_restart.log main.py --fdl_config=experiments.Tiny "${MAIN_FLAGS[@]}" \
        --fdl.MAX_STEPS=$((DEFAULT_STEPS + 10)) --job_log_dir="$work/Tiny" "${cache[@]}" \
        || rc=1
    return "$rc"
}

part_speed() {
    local rc=0
    # GPT126M (the Synthetic126M experiment) at batch 8 with its PyTorch peer in one run;
    # then the larger two at their experiments' batches (8 and 4), as the earlier figures.
    run speed.log bench/gpu_bench.py --configs Synthetic126M --impls auto --torch \
        --percore_batch_size 8 "${BENCH_STEPS[@]}" --timeout 100 \
        --json "$out/speed_gpt126m.json" || rc=1
    run speed.log bench/gpu_bench.py --configs Llama1B,GPT1_3B --impls auto \
        "${BENCH_STEPS[@]}" --timeout 120 --json "$out/speed_large.json" || rc=1
    return "$rc"
}

part_moe() {
    # The dropless MoE and its dense peer first (their tokens/s ratio is the key figure),
    # the same MoE by tokamax's kernels, its padded backend, then GLaM on praxis's GShard
    # layers (its attention: praxis, which auto resolves to).
    run moe.log bench/gpu_bench.py \
        --configs Qwen3A3B_moe,Qwen3A3B_dense,Qwen3A3B_tokamax,Qwen3A3B_padded,GLaM126M64E \
        --impls auto "${BENCH_STEPS[@]}" --timeout 100 --json "$out/moe.json"
}

part_fp8() {
    run fp8.log bench/gpu_bench.py --configs Synthetic5B --impls auto --fp8 --loss_steps 30 \
        --percore_batch_size 4 "${BENCH_STEPS[@]}" --timeout 100 --json "$out/fp8.json"
}

part_long() {
    # Llama 3.1 8B's attention (32 heads over 8 key/value heads of 128): a row's figures
    # only, for the log; a kernel that fails is a row of its own, not the part's failure.
    run long.log bench/attention_kernels.py --batch 1 --seq 16384 --heads 32 --kv_heads 8 \
        --head_dim 128 --rows cudnn-packed,pallas,pallas-positions,flash --repeats 5
    # Shortest first: the key is the longest row that trained; a longer one that does not
    # fit (131072 tokens on an H100, as planned) is the expected end of the search.
    run long.log bench/gpu_bench.py --configs Llama8B_64K,Llama8B_128K --impls auto \
        --steps 2 --warmup 1 --timeout 160 --json "$out/long.json"
}

usage() {
    sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

dry_run_parts() {
    local part failed=0
    declare -A pid
    echo "gpu_check --dry-run: the command lines of each part, checked on this machine"
    # The parts' checks are independent: side by side, the dry run takes half as long on 2 cores.
    for part in "${chosen[@]}"; do
        "part_$part" >"$work/$part.dry" 2>&1 &
        pid[$part]=$!
    done
    for part in "${chosen[@]}"; do
        if wait "${pid[$part]}"; then
            printf '%-8s budget %4d s  ok\n' "$part" "${BUDGET[$part]}"
        else
            printf '%-8s budget %4d s  FAILED\n' "$part" "${BUDGET[$part]}"
            failed=1
        fi
        cat "$work/$part.dry"
    done
    printf '%-8s budget %4d s  (at most %d s)\n' total "$total" "$MAX_TOTAL_S"
    if ((total > MAX_TOTAL_S)); then
        echo "the budgets add up to ${total} s, over ${MAX_TOTAL_S} s"
        failed=1
    fi
    return "$failed"
}

check_parts() {
    local part start rc key status banked=0 failed=0 rows=() deadline timed_out  # for run
    for part in "${PARTS[@]}"; do
        if [[ " ${chosen[*]} " == *" $part "* ]]; then
            echo "=== $part (budget ${BUDGET[$part]} s + ${banked} s left over) ==="
            rm -f "$out/$part".* "$out/$part"_*  # a rerun's key reads this run's files only
            start=$SECONDS
            deadline=$((start + BUDGET[$part] + banked))
            timed_out=0
            "part_$part"
            rc=$?
            # After a kill, the files hold what the part finished; the key says so.
            key=$("$PYTHON" bench/gpu_check_figures.py key "$part" "$out" 2>&1) || rc=1
            if ((timed_out)); then status=TIMEOUT; elif ((rc)); then status=FAILED; else status=ok; fi
            [[ $status == ok ]] || failed=1
            banked=$((deadline - SECONDS))  # negative after a kill's grace: the next part pays
            rows+=("$(printf '%-8s %-8s %7d %7d  %s' "$part" "$status" $((SECONDS - start)) \
                "${BUDGET[$part]}" "${key//$'\n'/ }")")
        else
            rows+=("$(printf '%-8s %-8s %7s %7s' "$part" skipped - -)")
        fi
        # Rewritten after each part: a run cut off from outside still leaves its table.
        { printf '%-8s %-8s %7s %7s  %s\n' part status seconds budget 'key figure'
          printf '%s\n' "${rows[@]}"; } >"$out/summary.txt"
    done
    echo "=== summary (${SECONDS} s in all; logs and JSON in $out) ==="
    cat "$out/summary.txt"
    return "$failed"
}

main() {
    # Seen by the functions main calls (bash's scoping is dynamic); $work is global for the
    # EXIT trap.
    local dry=0 parts_list=${GPU_CHECK_PARTS:-} part name seconds total=0 chosen=() dry_run out
    while (($#)); do
        case "$1" in
            --dry-run) dry=1 ;;
            --parts) parts_list=${2:?--parts needs a list}; shift ;;
            --parts=*) parts_list=${1#--parts=} ;;
            --budget) [[ $# -ge 2 ]] || { echo "--budget needs PART=SECONDS" >&2; return 2; }
                set -- "--budget=$2" "${@:3}"; continue ;;
            --budget=*)
                name=${1#--budget=}; seconds=${name#*=}; name=${name%%=*}
                if [[ -z $name || -z ${BUDGET[$name]+x} || ! $seconds =~ ^[1-9][0-9]*$ ]]; then
                    echo "--budget: PART=SECONDS with PART one of ${PARTS[*]}" >&2
                    return 2
                fi
                BUDGET[$name]=$seconds ;;
            -h | --help) usage; return 0 ;;
            *) echo "unknown argument '$1' (see --help)" >&2; return 2 ;;
        esac
        shift
    done
    for part in ${parts_list//,/ }; do
        if [[ -z ${BUDGET[$part]+x} ]]; then  # a typo must not silently skip a part
            echo "unknown part '$part': choose from ${PARTS[*]}" >&2
            return 2
        fi
    done
    for part in "${PARTS[@]}"; do  # always in this order, whatever order was asked
        if [[ ",$parts_list," == *",$part,"* ||
              ( -z $parts_list && " ${OPTIONAL_PARTS[*]} " != *" $part "* ) ]]; then
            chosen+=("$part")
            total=$((total + BUDGET[$part]))
        fi
    done

    cd "$(dirname "${BASH_SOURCE[0]}")/.." || return 1
    dry_run=$dry
    work=$(mktemp -d /tmp/paxloom-gpu-check.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    # shellcheck source=scripts_gpu/common.sh
    source scripts_gpu/common.sh  # the XLA flag block of the launch scripts; sets $PYTHON
    export PYTHONUNBUFFERED=1
    out=${OUT:-runs/gpu_check}
    if ((dry_run)); then
        dry_run_parts
        return
    fi
    if ((total > MAX_TOTAL_S)); then
        echo "the budgets add up to ${total} s, over ${MAX_TOTAL_S} s: lower one (--budget)" >&2
        return 2
    fi
    mkdir -p "$out"
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [[ " ${chosen[*]} " != *" install "* && ! -d $SITE ]]; then
        echo "note: $SITE is missing: on a fresh machine, add install to --parts"
    fi
    check_parts
}

# Run, unless sourced (tests/test_gpu_check.py sources it to break a command line on purpose).
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
