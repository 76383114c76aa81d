#!/bin/bash
# Arguments inside quoted shell variables (the older Megatron-LM examples/pretrain_gpt.sh style), 8 A100s
GPT_ARGS="
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 1 \
    --sequence-parallel \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 11008 \
    --num-attention-heads 32 \
    --seq-length 4096 \
    --max-position-embeddings 4096 \
    --micro-batch-size 1 \
    --global-batch-size 256 \
    --swiglu --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights \
    --use-distributed-optimizer \
    --recompute-granularity full --recompute-method block --recompute-num-layers 8 \
    --bf16 \
    --lr 3.0e-4
"
DATA_ARGS="--data-path $DATA_PATH --split 949,50,1"
torchrun --nproc_per_node 8 pretrain_gpt.py $GPT_ARGS $DATA_ARGS --save $CKPT --load $CKPT
