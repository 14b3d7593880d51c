#!/bin/bash
# Inspect every activation dump in acts/ on a Slurm job array, one shard of the files per array task.
#
#   mkdir -p logs && sbatch examples/slurm_array.sh     # 16 tasks, as --array below says
#   sbatch --array=1-64 examples/slurm_array.sh         # any range (and step): the shards follow it
#   cat results/shard-*.jsonl > results.jsonl           # afterwards: one manifest of the whole run
#
# attnviz reads the task's place in the array from SLURM_ARRAY_TASK_ID, _MIN, _MAX and _STEP
# (--shard auto), runs the files of that shard, and appends one line per finished job to the task's
# results file. A task that is requeued, or an array resubmitted with the same range, skips the jobs
# its results file records as done (--resume) and redoes only the others.
#SBATCH --job-name=attnviz-inspect
#SBATCH --array=0-15
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time=02:00:00
#SBATCH --output=logs/attnviz-%A_%a.log

set -euo pipefail
mkdir -p out results
attnviz batch --shard auto --jobs "${SLURM_CPUS_PER_TASK:-1}" --resume --quiet \
    --results "results/shard-${SLURM_ARRAY_TASK_ID}.jsonl" \
    --each 'acts/*.npz' \
    -- inspect {} --png 'out/{stem}.png' --json-file 'out/{stem}.json'
