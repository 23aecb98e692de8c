"""Heads across devices (chapter 15): attention split over processes with torch.distributed.

PyTorch only; imports the torch face, never the other way round. The modules:
    launcher     launch(fn, world_size, *args): fn in world_size processes of one process group
    rank_process what runs in each rank's process (and rank_device); launch_errors: how a launch fails
    comm         the collectives, counted (count_payload) and differentiable
    tensor       tensor parallelism by heads (Megatron-LM): tensor_parallel(module)
    sequence     the sequence's layouts over ranks (contiguous, zigzag), what Ulysses and the ring share
    ulysses      sequence parallelism by all-to-all (DeepSpeed-Ulysses)
    ring         ring attention, its own backward
    equivalence  every scheme against one process: the cases tests and the chapter launch
"""

from mha.distributed.comm import (
    Traffic, all_reduce_gradients, all_to_all, copy_to_ranks, count_payload, ring_pass, sum_over_ranks,
)
from mha.distributed.launcher import LaunchTimeout, PortInUseError, RankError, launch, rank_device
from mha.distributed.ring import RingAttention, merge_partials, ring_attention
from mha.distributed.sequence import gather_sequence, positions_of, split_sequence
from mha.distributed.tensor import (
    TensorParallelAttention, TensorParallelEncoderBlock, TensorParallelFeedForward, TensorParallelLMBlock,
    tensor_parallel, torch_tensor_parallel,
)
from mha.distributed.ulysses import UlyssesAttention, ulysses_attention

__all__ = [
    "LaunchTimeout", "PortInUseError", "RankError", "RingAttention", "TensorParallelAttention",
    "TensorParallelEncoderBlock", "TensorParallelFeedForward", "TensorParallelLMBlock", "Traffic", "UlyssesAttention",
    "all_reduce_gradients", "all_to_all", "copy_to_ranks", "count_payload", "gather_sequence", "launch",
    "merge_partials", "positions_of", "rank_device", "ring_attention", "ring_pass", "split_sequence",
    "sum_over_ranks", "tensor_parallel", "torch_tensor_parallel", "ulysses_attention",
]
