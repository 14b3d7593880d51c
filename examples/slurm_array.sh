#!/bin/bash
# Inspect every activation dump in a bucket on a Slurm job array, one shard of the files per array task:
# the nodes share the bucket, not a disk. Each task lists s3://.../acts/, reads the files of its shard from
# the bucket, writes its pictures and documents there, and keeps its results manifest there.
#
#   mkdir -p logs && sbatch examples/slurm_array.sh                  # 16 tasks, as --array below says
#   sbatch --array=1-64 examples/slurm_array.sh                      # any range (and step): the shards follow it
#   ATTNVIZ_DATA=/shared/attnviz sbatch examples/slurm_array.sh      # a shared folder instead of a bucket
#   aws s3 cp --recursive s3://my-bucket/attnviz/results/ results/ && cat results/shard-*.jsonl > results.jsonl
#
# Credentials and the endpoint come from where the AWS tools look (the job's environment, ~/.aws, the
# node's instance role; AWS_ENDPOINT_URL for an S3-compatible server); pip install 'attnviz[s3]' brings s3fs.
# attnviz reads the task's place in the array from SLURM_ARRAY_TASK_ID, _MIN, _MAX and _STEP
# (--shard auto), runs the files of that shard, and writes its results manifest (one JSON line per finished
# job, the object written whole after each) to the bucket. A task that is requeued, or an array resubmitted
# with the same range, skips the jobs its manifest records as done (--resume) and redoes only the others;
# an output appears in the bucket only when its job succeeded.
#SBATCH --job-name=attnviz-inspect
#SBATCH --array=0-15
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time=02:00:00
#SBATCH --output=logs/attnviz-%A_%a.log

set -euo pipefail
DATA="${ATTNVIZ_DATA:-s3://my-bucket/attnviz}"  # acts/ in, out/ and results/ out: a bucket (s3://, gs://, az://) or a folder
case "$DATA" in
  *://*) ;;                                      # a bucket has no folders to make
  *) mkdir -p "$DATA/out" "$DATA/results" ;;
esac
attnviz batch --shard auto --jobs "${SLURM_CPUS_PER_TASK:-1}" --resume --quiet \
    --results "$DATA/results/shard-${SLURM_ARRAY_TASK_ID}.jsonl" \
    --each "$DATA/acts/*.npz" \
    -- inspect {} --png "$DATA/out/{stem}.png" --json-file "$DATA/out/{stem}.json"
