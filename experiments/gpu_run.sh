#!/usr/bin/env bash
# One pass of the GPU checks and benchmarks, each stage bounded in time, results under $OUT as
# plain files (JSON, text logs and the folders a stage writes; nothing is packed into an archive).
#
#   OUT=/path/to/out AUTOFUSE_COMMIT=<commit> bash experiments/gpu_run.sh [STAGE ...]
#
# Stages (default: tests attention model_fns cold host): tests (the GPU test tier, in TESTS_SHARDS
# processes at once, each test in one; with AUTOFUSE_CHECK_BOUNDS=1 every kernel's loads and
# stores checked against their buffers, its logs named _bounds), attention
# (experiments.bench.attention_bench), model_fns (autofuse tune over
# experiments/bench/model_spec.py), suite (autofuse tune over experiments/bench/suite_spec.py),
# cold (experiments.bench.cold_start), host (experiments.bench.host_overhead), models
# (experiments.bench.bench_models, inference and training), code (experiments.probes.kernel_code:
# Inductor's and autofuse's kernels for CODE_FUNCTIONS, Inductor in torch.compile mode CODE_MODE,
# CODE_WHICH=inductor for its side only), bwd_sweep (experiments.probes.attn_bwd_sweep: the
# attention backward kernel's configs timed, BWD_VARIANTS, BWD_CONFIGS at most, those where the
# Python condition BWD_WHERE on the config c holds).
# Each stage's seconds: STAGE_S_<stage> (e.g. STAGE_S_attention=300); the cold stage's workloads
# and repeats: COLD_WORKLOADS, COLD_REPEATS (its record is written after each workload); a subset
# of the tuned workloads: MODEL_WORKLOADS, SUITE_WORKLOADS (comma-separated names); the models
# stage's models: MODELS, and MODELS_MAX_AUTOTUNE=1 to time torch.compile's max-autotune too;
# serving (experiments.bench.serving: per-request time over a length distribution, compile
# counts): SERVING_MODELS (decoder,encoder), SERVING_MODE_S (warm-up seconds per mode),
# SERVING_ARGS; conv (experiments.probes.conv_layout: the first convolution alone and the whole
# problem in eager, both memory formats, beside torch.compile; KernelBench level 2 CONV_PROBLEMS
# under KB_DIR); breakdown (experiments.bench.breakdown: each of MODELS' training step by phase
# and kernel class, eager, torch.compile default and autofuse); kb (experiments.kernelbench on
# KB_DIR: level KB_LEVEL, problems KB_PROBLEMS, dtype KB_DTYPE, variants KB_VARIANTS, KB_PHASE
# as-made / eval / train, one record file); conv_profile (experiments.probes.conv_profile: each KB_PROBLEMS problem's kernels by
# device time and launches, the plan choice and layout times, KB_PHASE=eval for eval mode,
# KB_DTYPE fp32 or bf16); sweep (experiments.probes.sweep: every launch
# config of SWEEP_WORKLOADS' groups timed alone, L2_52-style names from KB_DIR, SWEEP_KINDS,
# SWEEP_CONFIGS at most per group); fuzz (experiments.fuzz with real kernels: FUZZ_GRAPHS graphs of
# seed FUZZ_SEED in FUZZ_JOBS shards, forward and backward; the merged summary, the graphs'
# records and the shrunk repros, each one file under $OUT); ab (experiments.probes.plan_ab: the
# greedy plans of AB_SETS (suite,models) and KernelBench level-2 AB_PROBLEMS timed with this
# tree and with commit AB_OLD's autofuse/ unpacked in ab_old/ (carried), each twice, interleaved).
set -u
OUT=${OUT:?set OUT to the folder for results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
C=${AUTOFUSE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
stages=${*:-tests attention model_fns cold host}
limit() { local v="STAGE_S_$1"; echo "${!v:-$2}"; }
for s in $stages; do
    t0=$(date +%s)
    case $s in
        tests) n=${TESTS_SHARDS:-1}
               b=${AUTOFUSE_CHECK_BOUNDS:+_bounds}  # the bounds-checked tier's files apart
               # the node ids (pyproject's addopts holds -q: one more would print counts)
               python3 -m pytest -m gpu --collect-only -p no:warnings 2>/dev/null | grep "::" > /tmp/gpu_ids
               echo "$(wc -l < /tmp/gpu_ids) GPU tests in $n processes"
               [ -s /tmp/gpu_ids ] || { echo "no GPU tests listed"; continue; }
               split -n "r/$n" -d /tmp/gpu_ids /tmp/gpu_ids_
               for f in /tmp/gpu_ids_*; do
                   timeout "$(limit tests 240)" xargs -a "$f" python3 -m pytest -m gpu -p no:warnings -rf \
                       > "$OUT/gpu_tests_${C}${b}_${f##*_}.txt" 2>&1 &
               done; wait
               grep -hE "passed|failed|^FAILED" "$OUT"/gpu_tests_"$C$b"_*.txt | tail -20 ;;
        attention) timeout "$(limit attention 360)" python3 -m experiments.bench.attention_bench \
                       --out "$OUT" --train-variants causal,gqa --trials 4 --time-budget 12 \
                       --max-autotune-passes forward 2>&1 | grep -v Warning | tail -12 ;;
        model_fns) timeout "$(limit model_fns 420)" python3 -m autofuse tune experiments/bench/model_spec.py \
                       --trials 6 --time-budget 8 --polish 8 --out "$OUT/model_fns" --no-progress \
                       ${MODEL_WORKLOADS:+--workloads "$MODEL_WORKLOADS"} \
                       2>&1 | tail -5 ;;
        suite) timeout "$(limit suite 540)" python3 -m autofuse tune experiments/bench/suite_spec.py \
                   --trials 12 --time-budget 18 --polish 8 --out "$OUT/suite" --no-progress \
                   ${SUITE_WORKLOADS:+--workloads "$SUITE_WORKLOADS"} 2>&1 | tail -5 ;;
        cold) timeout "$(limit cold 560)" python3 -m experiments.bench.cold_start --out "$OUT" --trials 2 \
                  --time-budget 10 --repeats "${COLD_REPEATS:-2}" \
                  --workloads "${COLD_WORKLOADS:-rmsnorm_residual,gemm_bias_gelu,decoder_block}" 2>&1 | tail -4
              mv "$OUT/cold_start.json" "$OUT/cold_start_$C.json" 2>/dev/null
              rm -rf "$OUT/cold_start_caches" ;;
        host) timeout "$(limit host 90)" python3 -m experiments.bench.host_overhead --out "$OUT" 2>&1 | tail -12
              mv "$OUT/host_overhead.json" "$OUT/host_overhead_$C.json" 2>/dev/null ;;
        models) ma=--skip-max-autotune; [ -n "${MODELS_MAX_AUTOTUNE:-}" ] && ma=
                timeout "$(limit models 540)" python3 -m experiments.bench.bench_models --out "$OUT" \
                    --size realistic --models "${MODELS:-gpt2,llama_eager,llama_sdpa,bert,vit}" \
                    --modes inference,train $ma \
                    --dump-code --tag "models_$C" --budget-s "$(( $(limit models 540) - 30 ))" \
                    2>&1 | tail -14 ;;
        bwd_sweep) timeout "$(limit bwd_sweep 150)" python3 -m experiments.probes.attn_bwd_sweep --out "$OUT" \
                       --variants "${BWD_VARIANTS:-causal}" --max-configs "${BWD_CONFIGS:-28}" \
                       ${BWD_WHERE:+--where "$BWD_WHERE"} 2>&1 | tail -16 ;;
        code) timeout "$(limit code 150)" python3 -m experiments.probes.kernel_code --out "$OUT/kernel_code" \
                  --mode "${CODE_MODE:-default}" --which "${CODE_WHICH:-inductor,autofuse}" \
                  ${CODE_FUNCTIONS:-column_stats lm_cross_entropy group_norm_silu gpt2_split_heads} 2>&1 | tail -8 ;;
        serving) timeout "$(limit serving 560)" python3 -m experiments.bench.serving --out "$OUT" \
                     --tag "serving_$C" --models "${SERVING_MODELS:-decoder,encoder}" \
                     --budget-s "${SERVING_MODE_S:-40}" ${SERVING_ARGS:-} 2>&1 | grep -v Warning | tail -16 ;;
        conv) timeout "$(limit conv 150)" python3 -m experiments.probes.conv_layout "${KB_DIR:?set KB_DIR to a KernelBench checkout}" \
                  --level 2 --problems "${CONV_PROBLEMS:-1-5}" --dtypes fp32,bf16 --out "$OUT" 2>&1 | tail -12
              mv "$OUT/conv_layout.json" "$OUT/conv_layout_$C.json" 2>/dev/null ;;
        breakdown) timeout "$(limit breakdown 300)" python3 -m experiments.bench.breakdown --out "$OUT" \
                       --models "${MODELS:-gpt2,llama_eager,llama_sdpa,bert,vit}" --size realistic 2>&1 | tail -8
                   mv "$OUT/breakdown.json" "$OUT/breakdown_$C.json" 2>/dev/null ;;
        kb) timeout "$(limit kb 540)" python3 -m experiments.kernelbench "${KB_DIR:?set KB_DIR}" \
                --level "${KB_LEVEL:-2}" --mode gpu --dtype "${KB_DTYPE:-fp32}" --phase "${KB_PHASE:-as-made}" \
                --variants "${KB_VARIANTS:-default,greedy}" --problems "${KB_PROBLEMS:?set KB_PROBLEMS}" \
                --out /tmp/kb_out --records "$OUT/kb_L${KB_LEVEL:-2}_${KB_DTYPE:-fp32}${KB_PHASE:+_$KB_PHASE}_$C.json" \
                --deadline "$(( $(limit kb 540) - 60 ))" --timeout 150 2>&1 | grep -v Warn | tail -14 ;;
        conv_profile) timeout "$(limit conv_profile 200)" python3 -m experiments.probes.conv_profile \
                          "${KB_DIR:?set KB_DIR}" --level "${KB_LEVEL:-2}" --problems "${KB_PROBLEMS:?set KB_PROBLEMS}" \
                          --phase "${KB_PHASE:-as-made}" --dtype "${KB_DTYPE:-fp32}" \
                          --out "$OUT/conv_profile${KB_PHASE:+_$KB_PHASE}_${KB_DTYPE:-fp32}_$C.json" 2>&1 | grep -v Warn | tail -8 ;;
        sweep) timeout "$(limit sweep 200)" python3 -m experiments.probes.sweep --out "$OUT" --tag "sweep_$C" \
                   --workloads "${SWEEP_WORKLOADS:?set SWEEP_WORKLOADS}" --kb "${KB_DIR:-}" \
                   --kinds "${SWEEP_KINDS:-}" --max-configs "${SWEEP_CONFIGS:-40}" ${SWEEP_WHERE:+--where "$SWEEP_WHERE"} 2>&1 | grep -v Warn | tail -24 ;;
        fuzz) d=/tmp/gpu_fuzz_$C; rm -rf "$d"
              timeout "$(limit fuzz 300)" python3 -m experiments.fuzz --graphs "${FUZZ_GRAPHS:-1000}" \
                  --seed "${FUZZ_SEED:-13}" --backward --out "$d" --device cuda --jobs "${FUZZ_JOBS:-12}" \
                  --timeout 60 > "$OUT/fuzz_gpu_$C.log" 2>&1
              cp "$d/summary.json" "$OUT/fuzz_gpu_summary_$C.json" 2>/dev/null
              cat "$d"/shard*/graphs.jsonl > "$OUT/fuzz_gpu_graphs_$C.jsonl" 2>/dev/null
              for f in "$d"/shard*/repros/*.py; do [ -f "$f" ] && { echo "# ==== ${f#$d/}"; cat "$f"; }; done \
                  > "$OUT/fuzz_gpu_repros_$C.txt"
              tail -3 "$OUT/fuzz_gpu_$C.log" ;;
        ab) o=${AB_OLD:?set AB_OLD to the old commit whose autofuse/ is unpacked in ab_old/}
            [ -d ab_old/autofuse ] || { echo "no ab_old/autofuse (git archive $o autofuse | tar -x -C ab_old)"; continue; }
            args="--sets ${AB_SETS:-suite,models} ${AB_PROBLEMS:+--kb ${KB_DIR:?set KB_DIR} --problems $AB_PROBLEMS}"
            half=$(( $(limit ab 500) / 2 ))
            for arm in new old new old; do  # interleaved: each tree twice, in both orders
                r=$(( ${r:-0} + 1 ))
                if [ $arm = old ]; then
                    (cd ab_old && AUTOFUSE_COMMIT=$o PYTHONPATH=${PYTHONPATH:-}:$OLDPWD timeout $(( half / 2 )) \
                        python3 -m experiments.probes.plan_ab --arm "$o" $args --out "$OUT/ab${r}_$o.json" \
                        --deadline $(( half / 2 - 15 )) > /dev/null 2>&1)
                else
                    timeout $(( half / 2 )) python3 -m experiments.probes.plan_ab --arm "$C" $args \
                        --out "$OUT/ab${r}_$C.json" --deadline $(( half / 2 - 15 )) > /dev/null 2>&1
                fi
            done; unset r; ls "$OUT"/ab*_*.json ;;
        *) echo "unknown stage $s (tests attention model_fns suite cold host models code bwd_sweep serving conv breakdown kb conv_profile sweep fuzz ab)"; exit 2 ;;
    esac
    echo "== $s: $(( $(date +%s) - t0 )) s"
done
