#!/usr/bin/env bash
# The GPU check: one prepared command for a lent GPU machine that fits 9 minutes on one H100
# or H200, the install included, and yields the figures that matter first. Run THERE, from
# the repository root, with .whl/ carried from `bash bench/gpu_wheels.sh` run here. Each part
# runs under its own time limit and writes its log (and JSON) to $OUT (else runs/gpu_check)
# as it goes, so a run cut off still returns what it finished. Every benchmark row compiles
# its train step first and compares the compiled step's memory with the device's: a row
# that cannot fit is an error row ("the train step needs X GiB ... has Y GiB free"), not an
# out-of-memory error from XLA, and the next row still runs.
#
# The first run (`bash bench/gpu_check.sh`, 540 s), in this order:
#   install     the carried wheels; then, as its first lines, the versions found against the
#               lock (constraints.txt) for the machine's jax, torch, ... and the carried
#               wheels: a line per mismatch, else one line that all matched; then the jax,
#               jaxlib, cuDNN and driver versions, the device
#   speed       the default path at real size: GPT126M (Synthetic126M) at batch 8 with
#               ATTENTION_IMPL=auto against its PyTorch peer (tokens/s, MFU, peak memory),
#               then 3 steps under jax's profiler, kept per kernel in the row's "profile"
#               (bench/step_account.py --profile sets it beside the roofline)
#   moe         mixtures of experts on one GPU: the dense Llama with a token's parameters
#               (Qwen3A3B_dense), then Qwen3-30B-A3B's shape cut to 4 layers by tokamax's
#               kernels (refused in one line where tokamax does not support the jax), by
#               capacity buffers and batched matmuls (padded), by ragged_dot, then Pax's
#               GLaM126M64E, as far as the part's time goes
#   fp8         FP8 against bfloat16 on the 5B shape cut to 8 layers: speed and both losses
# The second run, right after on the warm machine (`bash bench/gpu_check.sh --parts
# tests`, 225 s, at most 4 minutes with its start; give it --budget tests=320 when the
# first run left more than 5 minutes of device time):
#   tests       the tests that only run on a GPU, each test's name and outcome as it
#               finishes, each failure's reason in one line, a JUnit XML report
#               ($OUT/tests.xml); 30 s per test and a session limit (pytest-timeout) that
#               stops it in time to write its summary
# Only when named, in a later session (each needs `install` first on a fresh machine):
#   candidates  paths the measured table (layers/gpu_measurements.json) lacks, a few steps
#               each: the grouped-query Llama1B with cuDNN's packed attention at
#               MAX_SEGMENTS_PER_SEQ=8 and 16 (GPT126M's were measured at 8, 16 and 32),
#               GPT126M with the loss in one piece (LOSS_CHUNK_LEN=0: is the chunked loss
#               why the H200 trained slower than the H100 before it?) and with its
#               embeddings looked up by index (EMBEDDING_LOOKUP_STYLE="index": two
#               [tokens, vocab] matmuls fewer in the step account), then Llama1B by auto
#   layouts     the single-device choices the planner's search ranks, measured to check
#               its estimate: GPT126M (Synthetic126M) at batch 4, 8 and 16, then Llama1B at
#               batch 8 with each rematerialisation policy (save_nothing, none, and its own
#               save_dot_with_no_batch_dims), all with ATTENTION_IMPL=auto
#   default     main.py with nothing chosen on a packed GPT and a grouped-query Llama: a few
#               dozen steps, a decode from each checkpoint, and a restart (a second process)
#               that must load its train step from the persistent compilation cache
#   more        more candidates: cuDNN on unpacked rows (its plain causal call), jax's Pallas
#               on Llama1B (grouped key/value heads), cuDNN on Llama1B at bound 16
#   long        the attention kernels at 16384 tokens (cuDNN packed, jax's Pallas, the
#               context axis's kernels), then the longest sequence that trains on one GPU:
#               Llama 3.1 8B's shape cut to 4 layers at 65536 and 131072 tokens
# A part may also use the seconds that the parts before it left unused, so a run stays
# within the sum of its budgets. The last lines are a summary table (part, status, key
# figure), also in $OUT/summary.txt; the exit status is non-zero when a part failed or ran
# out of time. The benchmark rows become rows of the measured table with
# `python bench/gpu_check_figures.py record OUT...` (docs/guides/gpu_check.md).
# `--dry-run` checks here, on CPU, that every command line of the chosen parts (without
# --parts: the first and the second run) is valid (main.py with --print_config,
# gpu_bench.py with --dry_run, pytest with --collect-only) and prints the budgets.
#
#   bash bench/gpu_check.sh                          # the first run
#   bash bench/gpu_check.sh --parts tests            # the second run, on the warm machine
#   bash bench/gpu_check.sh --parts install,default  # one part on a fresh machine
#   GPU_CHECK_PARTS=fp8 bash bench/gpu_check.sh --budget fp8=200   # one part, more time
#   bash bench/gpu_check.sh --dry-run                # here: valid command lines, budgets
set -uo pipefail  # not -e: a part that fails is recorded and the parts after it still run

PARTS=(install speed moe fp8 candidates layouts tests default more long)  # the order they run in
FIRST_RUN=(install speed moe fp8)  # without --parts
SECOND_RUN=(tests)  # --parts tests, right after the first on the warm machine
# Seconds per part, from what each runs: a gpu_bench call starts jax once to look at the
# device (~6 s), then a process per row: a jax start (~10 s), the model's state, its train
# step's compile (GPT126M 30-37 s, Llama1B ~50, GPT1_3B 69 on an H100), a few steps; the
# PyTorch peer's torch.compile ~40-60 s. speed: 6 + ~60 (torch) + ~50 (GPT126M) + ~10 (3
# profiled steps and their summary) = ~125 s. moe: 6 + ~55 (the dense peer) + 2 x ~70
# (tokamax, padded) = ~200 s; ragged_dot's row (~75) and GLaM's (~60) when the parts before
# left time. fp8: 6 + 2 x ~65 (the 5B shape cut to 8 layers, a scanned layer, compiled in
# bfloat16 then FP8, 30 steps each) = ~140 s. candidates: four calls, two Llama1B rows,
# two GPT126M rows, then Llama1B by auto: 4 x 6 + 3 x ~60 + 2 x ~50 = ~300 s. layouts (242 s
# on an H200): two calls, three GPT126M rows and three Llama1B rows. tests: 225 s, the
# second run (285 s on an H200: the session limit may end them; the first tests:
# tests/test_attention.py, which names every attention path). default: 5 main.py
# processes, 75-100 s. more: three rows, ~200 s. long: ~60 s of kernels then two rows of
# 70-110 s each.
declare -A BUDGET=([install]=25 [speed]=130 [moe]=200 [fp8]=140 [candidates]=300
                   [layouts]=355 [tests]=225 [default]=95 [more]=210 [long]=300)
MAX_TOTAL_S=540  # 9 minutes: a 10-minute device command with room for its start
SECOND_RUN_S=225  # the second run's budgets: 4 minutes of device time with the transfers
# Every test file that runs only on a GPU (a skip off GPUs, or cases under ON_GPU);
# tests/test_gpu_check.py checks that none is missing. test_attention.py first: it names
# every attention path, so a session cut short still says something of each.
GPU_TESTS=(tests/test_attention.py tests/test_fused_training.py tests/test_flash_pallas.py)
TEST_LIMIT_S=30  # per test (pytest-timeout)
SITE=/tmp/paxloom-site  # where the carried wheels go, beside the machine's own jax
MAIN_FLAGS=("--fdl.ICI_MESH_SHAPE=[1,1,1]")  # one GPU; everything else as the experiment says
DEFAULT_STEPS=30
BENCH_STEPS=(--steps 10 --warmup 2)  # the rows whose figures are the check's key figures
FEW_STEPS=(--steps 6 --warmup 1)  # candidates and mixtures: a table row's figures

# run LOG ARGS...: "$PYTHON" ARGS within what is left of the part's time, its output shown
# and appended to $out/LOG as it comes; at the limit the process gets $RUN_SIGNAL (TERM
# unless set), then KILL 10 s later. In a dry run, ARGS are only validated (validate).
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
    timeout -s "${RUN_SIGNAL:-TERM}" -k 10 "$left" "$PYTHON" "$@" 2>&1 | tee -a "$out/$log"
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
    # The lock's lines first: they need no jax, so they are there even where jax does not start.
    run install.log bench/gpu_check_figures.py versions
}

part_speed() {
    # The default path (ATTENTION_IMPL=auto) at real size, before anything else: GPT126M at
    # batch 8 after its PyTorch peer (the ratio is the key figure), then profiled.
    run speed.log bench/gpu_bench.py --configs Synthetic126M --impls auto --torch \
        --percore_batch_size 8 "${BENCH_STEPS[@]}" --profile_steps 3 --timeout 110 \
        --json "$out/speed.json"
}

part_candidates() {
    local rc=0
    # Paths the measured table lacks: the grouped-query Llama1B (its experiment's batch 8)
    # with cuDNN's packed layout at smaller segment bounds (its kernel and buffers shrink
    # with the bound); GPT126M's rows at 8, 16 and 32 are in the table.
    run candidates.log bench/gpu_bench.py --configs Llama1B --impls cudnn \
        --sweep MAX_SEGMENTS_PER_SEQ=8,16 "${FEW_STEPS[@]}" --timeout 110 \
        --json "$out/candidates_llama1b.json" || rc=1
    # GPT126M on unpacked rows trained at 404k tokens/s on an H100 before the chunked loss
    # and at 363k on an H200 after it: the same row with the loss in one piece.
    run candidates.log bench/gpu_bench.py --configs Synthetic126M --impls cudnn --unpacked \
        --set LOSS_CHUNK_LEN=0 --percore_batch_size 8 "${FEW_STEPS[@]}" --timeout 90 \
        --json "$out/candidates_loss.json" || rc=1
    run candidates.log bench/gpu_bench.py --configs Synthetic126M --impls auto \
        --set EMBEDDING_LOOKUP_STYLE=index --percore_batch_size 8 "${FEW_STEPS[@]}" \
        --timeout 90 --json "$out/candidates_embedding.json" || rc=1
    run candidates.log bench/gpu_bench.py --configs Llama1B --impls auto "${FEW_STEPS[@]}" \
        --timeout 110 --json "$out/candidates_llama1b_auto.json" || rc=1
    return "$rc"
}

part_layouts() {
    local rc=0
    # What the planner's search chooses among on one device, each measured: the batch (the
    # plain GPT stack saves everything), then the rematerialisation policy of a scanned
    # Llama, new ones first.
    run layouts.log bench/gpu_bench.py --configs Synthetic126M --impls auto \
        --sweep PERCORE_BATCH_SIZE=4,8,16 "${FEW_STEPS[@]}" --timeout 90 \
        --json "$out/layouts_gpt126m.json" || rc=1
    run layouts.log bench/gpu_bench.py --configs Llama1B --impls auto \
        --sweep CHECKPOINT_POLICY=save_nothing,none,save_dot_with_no_batch_dims \
        "${FEW_STEPS[@]}" --timeout 110 --json "$out/layouts_llama1b.json" || rc=1
    return "$rc"
}

part_tests() {
    local limit=() platform=cuda session=$TEST_LIMIT_S
    # The tests pick the CPU unless told (tests/conftest.py); a dry run collects them there.
    if ((dry_run)); then
        platform=cpu
    else
        session=$((deadline - SECONDS - 20))
    fi
    if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then
        # pytest starts no test after the session limit (the one under way finishes, or the
        # part's SIGINT stops it), then writes its summary and tests.xml.
        limit=(--timeout="$TEST_LIMIT_S" --session-timeout=$((session > 10 ? session : 10)))
    else
        echo "    pytest-timeout is not installed: no per-test limit, only the part's" \
            "(bash bench/gpu_wheels.sh carries it)"
    fi
    # -v: each test's name and outcome as it finishes; -rfE --tb=line: each failure's and
    # error's reason in one line; at the part's limit SIGINT, so that pytest still writes.
    RUN_SIGNAL=INT JAX_PLATFORMS=$platform run tests.log -m pytest -v -rfE --tb=line \
        -p no:cacheprovider --junitxml="$out/tests.xml" "${limit[@]}" "${GPU_TESTS[@]}"
    local rc=$?
    if ((!dry_run)) && grep -q "session-timeout: .* exceeded" "$out/tests.log"; then
        timed_out=1  # the tests after it did not run: the summary says TIMEOUT
    fi
    return "$rc"
}

part_moe() {
    # The dense peer first (the MoE rows' ratio to it is the key figure), then the backends
    # whose work grows with the tokens routed (tokamax's kernels, capacity buffers), then
    # ragged_dot (2% MFU on an H200) and GLaM on praxis's GShard layers (its attention:
    # praxis, which auto resolves to), as far as the part's time goes.
    run moe.log bench/gpu_bench.py \
        --configs Qwen3A3B_dense,Qwen3A3B_tokamax,Qwen3A3B_padded,Qwen3A3B_moe,GLaM126M64E \
        --impls auto "${FEW_STEPS[@]}" --timeout 100 --json "$out/moe.json"
}

part_fp8() {
    run fp8.log bench/gpu_bench.py --configs Synthetic5B --impls auto --fp8 --loss_steps 30 \
        --percore_batch_size 4 "${BENCH_STEPS[@]}" --timeout 100 --json "$out/fp8.json"
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

part_more() {
    local rc=0
    # cuDNN on unpacked rows (its plain causal call: the unpacked case), then the
    # grouped-query case: jax's Pallas kernel and cuDNN at a smaller bound on Llama1B.
    run more.log bench/gpu_bench.py --configs Synthetic126M --impls cudnn --unpacked \
        --percore_batch_size 8 "${FEW_STEPS[@]}" --timeout 90 \
        --json "$out/more_unpacked.json" || rc=1
    run more.log bench/gpu_bench.py --configs Llama1B --impls pallas,cudnn \
        --set MAX_SEGMENTS_PER_SEQ=16 "${FEW_STEPS[@]}" --timeout 110 \
        --json "$out/more_llama1b.json" || rc=1
    return "$rc"
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

# dry_run_parts TITLE LIMIT PART...: check the parts' command lines side by side (on 2 cores
# half as long), then print each part's budget and their sum against LIMIT.
dry_run_parts() {
    local title=$1 limit=$2 part failed=0 sum=0
    shift 2
    declare -A pid
    echo "$title"
    for part in "$@"; do
        "part_$part" >"$work/$part.dry" 2>&1 &
        pid[$part]=$!
    done
    for part in "$@"; do
        sum=$((sum + BUDGET[$part]))
        if wait "${pid[$part]}"; then
            printf '%-10s budget %4d s  ok\n' "$part" "${BUDGET[$part]}"
        else
            printf '%-10s budget %4d s  FAILED\n' "$part" "${BUDGET[$part]}"
            failed=1
        fi
        cat "$work/$part.dry"
    done
    printf '%-10s budget %4d s  (at most %d s)\n' total "$sum" "$limit"
    if ((sum > limit)); then
        echo "the budgets add up to ${sum} s, over ${limit} s"
        failed=1
    fi
    return "$failed"
}

second_run() {  # the second run's --parts
    local IFS=,
    echo "${SECOND_RUN[*]}"
}

dry_run_all() {
    local failed=0
    if [[ -n $parts_list ]]; then
        dry_run_parts "gpu_check --dry-run: the command lines of each part, checked here" \
            "$MAX_TOTAL_S" "${chosen[@]}"
        return
    fi
    dry_run_parts "gpu_check --dry-run: the first run's command lines, checked here" \
        "$MAX_TOTAL_S" "${FIRST_RUN[@]}" || failed=1
    dry_run_parts "the second run (--parts $(second_run)), on the warm machine:" \
        "$SECOND_RUN_S" "${SECOND_RUN[@]}" || failed=1
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
            rows+=("$(printf '%-10s %-8s %7d %7d  %s' "$part" "$status" $((SECONDS - start)) \
                "${BUDGET[$part]}" "${key//$'\n'/ }")")
        else
            rows+=("$(printf '%-10s %-8s %7s %7s' "$part" skipped - -)")
        fi
        # Rewritten after each part: a run cut off from outside still leaves its table.
        { printf '%-10s %-8s %7s %7s  %s\n' part status seconds budget 'key figure'
          printf '%s\n' "${rows[@]}"; } >"$out/summary.txt"
    done
    echo "=== summary (${SECONDS} s in all; logs and JSON in $out) ==="
    cat "$out/summary.txt"
    if [[ -z $parts_list ]]; then
        echo "next: the second run on this warm machine: bash bench/gpu_check.sh --parts" \
            "$(second_run)"
    fi
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
              ( -z $parts_list && " ${FIRST_RUN[*]} " == *" $part "* ) ]]; then
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
        out=$work/out  # what a dry run writes (pytest's report) stays out of the clone
        dry_run_all
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
