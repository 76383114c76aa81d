#!/bin/bash
# In the shape of bigscience tr11-176B-ml.slurm (Megatron-DeepSpeed, 48 nodes x 8 A100 80GB)
NNODES=48
TP_SIZE=4
PP_SIZE=12
MICRO_BATCH_SIZE=2
GLOBAL_BATCH_SIZE=2048
NLAYERS=70
NHIDDEN=14336
NHEADS=112
SEQ_LEN=2048
ZERO_STAGE=0
config_json="./ds_config.$SLURM_JOBID.json"

GPT_ARGS=" \
    --pp-partition-method 'type:transformer|embedding' \
    --num-layers $NLAYERS \
    --hidden-size $NHIDDEN \
    --num-attention-heads $NHEADS \
    --seq-length $SEQ_LEN \
    --max-position-embeddings $SEQ_LEN \
    --micro-batch-size $MICRO_BATCH_SIZE \
    --rampup-batch-size 192 16 9_765_625 \
    --global-batch-size $GLOBAL_BATCH_SIZE \
    --train-samples 220_000_000 \
    --tokenizer-type PretrainedFromHF \
    --init-method-std 0.0048 \
    --embed-layernorm \
    --sync-tp-duplicated-parameters \
    --bf16 \
    --seed 42 \
    --position-embedding-type alibi \
    --checkpoint-activations \
    --abort-on-unmet-fused-kernel-constraints \
    --kill-switch-path $KILL_SWITCH_PATH \
    --pad-vocab-size-to 250880 \
    "
DEEPSPEED_ARGS=" \
    --deepspeed \
    --deepspeed_config ${config_json} \
    --zero-stage ${ZERO_STAGE} \
    --deepspeed-activation-checkpointing \
    "
export LAUNCHER="python -u -m torch.distributed.run"
export CMD=" \
    `pwd`/pretrain_gpt.py \
    --tensor-model-parallel-size $TP_SIZE \
    --pipeline-model-parallel-size $PP_SIZE \
    $GPT_ARGS \
    $DEEPSPEED_ARGS \
    "
$LAUNCHER $CMD
