#!/bin/bash
# Per-head corpus statistics of a model over a large text file on a Slurm job array: each array task runs
# its share of the lines (every COUNT-th line from its index: --shard auto), reading the text file from a
# bucket and writing its corpus file there; `attnviz merge` then adds the shards into what one run over
# every line gives. The nodes share the bucket, not a disk; the model is a local folder on every node.
#
#   mkdir -p logs && sbatch examples/slurm_corpus.sh                 # 8 tasks, as --array below says
#   sbatch --array=0-31 examples/slurm_corpus.sh                     # any range (and step): the shards follow it
#   ATTNVIZ_DATA=/shared/attnviz sbatch examples/slurm_corpus.sh     # a shared folder instead of a bucket
#
# and once every task has finished (or: sbatch --dependency=afterok:JOBID --wrap '...' with the same line):
#
#   attnviz merge $(for i in $(seq 0 7); do echo s3://my-bucket/attnviz/corpus/shard-$i.safetensors; done) \
#       -o s3://my-bucket/attnviz/corpus.safetensors
#   attnviz inspect s3://my-bucket/attnviz/corpus.safetensors --png layers.png --heads-map heads.png
#
# merge refuses shards of different models, tokenizers or settings, and two files holding the same shard.
# Credentials and the endpoint come from where the AWS tools look (pip install 'attnviz[s3]' brings s3fs).
#SBATCH --job-name=attnviz-corpus
#SBATCH --array=0-7
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time=04:00:00
#SBATCH --output=logs/attnviz-corpus-%A_%a.log

set -euo pipefail
DATA="${ATTNVIZ_DATA:-s3://my-bucket/attnviz}"              # corpus.txt in, corpus/ out: a bucket or a folder
MODEL="${ATTNVIZ_MODEL:-/shared/models/all-MiniLM-L6-v2}"   # a model folder (save_pretrained) on every node
case "$DATA" in
  *://*) ;;                                                 # a bucket has no folders to make
  *) mkdir -p "$DATA/corpus" ;;
esac
attnviz capture "$MODEL" --text-file "$DATA/corpus.txt" --corpus --shard auto --batch-size 16 \
    -o "$DATA/corpus/shard-${SLURM_ARRAY_TASK_ID}.safetensors"
