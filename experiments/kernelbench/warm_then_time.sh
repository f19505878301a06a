#!/usr/bin/env bash
# Warm each problem's builds (Triton, Inductor) in parallel processes, then time every problem
# in one process: the timed pass then measures kernels, not compilers.
#   experiments/kernelbench/warm_then_time.sh OUT WARM_S DEADLINE_S "GROUP1 GROUP2 ..." ARGS...
# GROUPs are --problems lists (e.g. "2,4,6 8,10"); ARGS go to every run (level, dtype, variants).
set -u
out=$1 warm=$2 deadline=$3 groups=$4
shift 4
all=$(echo "$groups" | tr ' ' ',')
i=0
for g in $groups; do
  timeout "$warm" python -m experiments.kernelbench kb "$@" --problems "$g" --rounds 1 \
    --correct-trials 1 --out "/tmp/warm$i" --timeout "$warm" >"/tmp/warm$i.log" 2>&1 &
  i=$((i + 1))
done
wait
python -m experiments.kernelbench kb "$@" --problems "$all" --out /tmp/timed \
  --records "$out" --deadline "$deadline" --timeout 90
