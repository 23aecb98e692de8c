"""Tensor parallelism by heads (Megatron-LM): each rank computes h / P of the heads.

With row vectors, Q = X W_Q. Splitting W_Q, W_K and W_V by columns, one group of heads
per rank, gives each rank its heads' queries, keys and values with no communication: a
head needs only its own columns. Splitting W_O by rows, the same groups, turns the
output into a sum over ranks,

    O W_O = sum_r O_r W_O[rows of r],

so one all-reduce per attention ends the layer. The feed-forward splits the same way,
W_1 by columns and W_2 by rows: one all-reduce more. Every rank holds the whole x and
the whole output; the backward pass sums the ranks' parts of x's gradient with one
all-reduce at each block's input (`comm.copy_to_ranks`).

Key/value heads: with P dividing h_kv, rank r holds h_kv / P of them, those its query
heads read. With fewer key/value heads than ranks (P a multiple of h_kv), each rank
holds a replica of the one key/value head its query heads share, and the replicas'
gradients are summed by `reduce_replicated_gradients()` before an optimizer step.

Per-head QK-norm (Qwen3, Gemma 3): one RMSNorm weight of width d_head serves every head, so every
rank holds it whole, but applies it to its own heads only: each rank's gradient is the part from
its heads, and the whole gradient is their sum. `reduce_replicated_gradients()` sums it too (as
Megatron-LM all-reduces its QK-layernorm gradients over the tensor-parallel group before the step).
QK-norm over all heads at once (OLMo 2) would need the sum of squares of every head: refused.
"""

import copy

import torch
import torch.distributed as dist
from torch import nn

import mha.distributed.comm as comm
from mha.torch.attention import MultiHeadAttention
from mha.torch.blocks import EncoderBlock, FeedForward
from mha.torch.grouped import GroupedQueryAttention
from mha.torch.lm import LMBlock
from mha.torch.parts import GatedFeedForward


def rank_and_world(group=None):
    """(rank, P) in `group`; a clear error outside a process group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tensor parallelism runs inside a torch.distributed process group: start the "
                           "ranks with mha.distributed.launch(fn, world_size, ...)")
    return dist.get_rank(group), dist.get_world_size(group)


def check_heads_split(n_heads, n_kv_heads, world_size):
    """Whether h query heads and h_kv key/value heads split over P ranks: P must divide h, and
    either divide h_kv or be a multiple of it (then key/value heads are replicated)."""
    if n_heads % world_size:
        raise ValueError(f"n_heads={n_heads} is not divisible by world_size={world_size}: tensor parallelism "
                         f"gives every rank the same number of heads (choose P among the divisors of {n_heads})")
    if n_kv_heads % world_size and world_size % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} and world_size={world_size}: P must divide the key/value "
                         f"heads, or be a multiple of them (then each rank holds a replica of one)")


def query_heads(n_heads, world_size, rank):
    """The query heads of `rank`: a range of h / P consecutive heads."""
    per_rank = n_heads // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def kv_heads(n_heads, n_kv_heads, world_size, rank):
    """The key/value heads `rank` holds: those its query heads read (one replicated head when P > h_kv)."""
    if n_kv_heads % world_size == 0:
        per_rank = n_kv_heads // world_size
        return range(rank * per_rank, (rank + 1) * per_rank)
    head = rank // (world_size // n_kv_heads)
    return range(head, head + 1)


def head_rows(heads, d_head):
    """Indices of the rows of an nn.Linear weight (d_out, d_in) that belong to `heads`."""
    return torch.arange(heads.start * d_head, heads.stop * d_head)


def as_grouped(module):
    """(h, h_kv, d_head, options) of a MultiHeadAttention or a GroupedQueryAttention, the options
    being what a GroupedQueryAttention of fewer heads needs to compute the same heads."""
    if isinstance(module, MultiHeadAttention):
        if module.dropout:
            raise ValueError(f"dropout={module.dropout}: the ranks would draw different masks; split a "
                             f"module without dropout")
        return module.n_heads, module.n_heads, module.d_model // module.n_heads, {}
    if isinstance(module, GroupedQueryAttention):
        if module.qk_norm == "all":
            raise ValueError('qk_norm="all" (OLMo 2) normalises over all heads at once, which a split by heads '
                             'would have to all-reduce: not computed here')
        options = dict(rope_base=module.rope_base, rope_scaling=module.rope_scaling, qk_norm=module.qk_norm,
                       scale=module.scale, logit_cap=module.logit_cap, sliding_window=module.sliding_window)
        if module.qk_norm == "head":
            options.update(norm_eps=module.q_norm.eps, norm_unit_offset=module.q_norm.unit_offset)
        return module.n_heads, module.n_kv_heads, module.d_head, options
    raise TypeError(f"expected a mha.torch.MultiHeadAttention or GroupedQueryAttention, got {type(module).__name__}")


class Shard:
    """Where a rank's parameter sits in the whole one: `dim` and `index` (None: the whole,
    replicated on every rank), whether other ranks hold the same slice (replicas), and whether
    a whole one's gradient on each rank is only the part from its own heads (summed: the whole
    gradient is the sum over ranks; else every rank computes the whole gradient itself)."""

    def __init__(self, full_shape, dim=None, index=None, replicated_slice=False, summed=False):
        self.full_shape, self.dim, self.index = tuple(full_shape), dim, index
        self.replicated_slice, self.summed = replicated_slice, summed


def take(weight, dim, index):
    """A copy of weight's slice `index` along `dim`, as a new Parameter."""
    return nn.Parameter(weight.detach().index_select(dim, index.to(weight.device)).clone())


class ShardedModule(nn.Module):
    """What the tensor-parallel modules share: a map from each local parameter to its place in
    the single-process module, to rebuild the whole gradients (for tests) and to sum replicas."""

    def __init__(self, group=None):
        super().__init__()
        self.group = group
        self.rank, self.world_size = rank_and_world(group)
        self.shards = {}  # local parameter name -> (full parameter name, Shard)

    def place(self, name, full_name, shard):
        self.shards[name] = (full_name, shard)

    def all_shards(self):
        """(local parameter, full name, Shard) for this module and every sharded submodule."""
        for prefix, module in self.named_modules():
            if isinstance(module, ShardedModule):
                for name, (full_name, shard) in module.shards.items():
                    parameter = module.get_parameter(name)
                    yield parameter, (f"{prefix}." if prefix else "") + full_name, shard

    def scatter_into_whole(self, tensor, shard):
        """A zero tensor of the whole shape holding `tensor` at this rank's slice."""
        whole = tensor.new_zeros(shard.full_shape)
        return whole.index_copy_(shard.dim, shard.index.to(tensor.device), tensor)

    def full_gradients(self):
        """{name in the single-process module: gradient}: split gradients gathered, replicas summed,
        whole ones as they are. Every rank must call it (it all-reduces; not counted as payload)."""
        grads = {}
        for parameter, full_name, shard in self.all_shards():
            grad = parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
            if shard.summed:
                grads[full_name] = grad.clone()
                dist.all_reduce(grads[full_name], group=self.group)
            elif shard.dim is None:
                grads[full_name] = grad.clone()
            else:
                whole = self.scatter_into_whole(grad, shard)
                dist.all_reduce(whole, group=self.group)
                grads[full_name] = whole
        return grads

    def reduce_replicated_gradients(self):
        """Sum the gradients of replicated key/value heads over their replicas, and those of the
        per-head QK-norms over every rank (backward all-reduces, counted), so that every replica
        takes the same optimizer step, the one a single process takes. Every rank must call it."""
        for parameter, _, shard in self.all_shards():
            if shard.summed:
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)  # a rank whose heads saw nothing
                comm.all_reduce_(parameter.grad, "backward", self.group)
            elif shard.replicated_slice and parameter.grad is not None:
                whole = self.scatter_into_whole(parameter.grad, shard)
                comm.all_reduce_(whole, "backward", self.group)
                parameter.grad.copy_(whole.index_select(shard.dim, shard.index.to(whole.device)))


class TensorParallelAttention(ShardedModule):
    """A MultiHeadAttention or GroupedQueryAttention split by heads over the ranks of `group`.

    Built on every rank from the same single-process module; this rank keeps its h / P query
    heads (a GroupedQueryAttention of those heads, `self.local`) and its key/value heads.
    forward(x, mask=None, *, causal=False, positions=None): x (..., T, d_model), the whole x on
    every rank; mask broadcasting to (..., h, T, T) (a head axis of size h is sliced to this rank's
    heads); returns (..., T, d_model), the whole output on every rank, after one all-reduce.
    """

    def __init__(self, module, group=None):
        super().__init__(group)
        n_heads, n_kv_heads, d_head, options = as_grouped(module)
        check_heads_split(n_heads, n_kv_heads, self.world_size)
        self.n_heads, self.d_model = n_heads, module.d_model
        self.heads = query_heads(n_heads, self.world_size, self.rank)
        self.kv = kv_heads(n_heads, n_kv_heads, self.world_size, self.rank)
        weight = module.W_q.weight
        self.local = GroupedQueryAttention(module.d_model, len(self.heads), len(self.kv), d_head=d_head,
                                           bias=module.W_q.bias is not None, device=weight.device,
                                           dtype=weight.dtype, **options)
        replicated = n_kv_heads < self.world_size
        rows = {"q": head_rows(self.heads, d_head), "k": head_rows(self.kv, d_head), "v": head_rows(self.kv, d_head)}
        for n, index in rows.items():
            full = getattr(module, f"W_{n}")
            setattr(self.local, f"W_{n}", self.split_linear(f"local.W_{n}", f"W_{n}", full, 0, index,
                                                            replicated and n != "q"))
        self.local.W_o = self.split_linear("local.W_o", "W_o", module.W_o, 1, rows["q"], False, bias=False)
        self.b_o = None if module.W_o.bias is None else nn.Parameter(module.W_o.bias.detach().clone())
        if self.b_o is not None:
            self.place("b_o", "W_o.bias", Shard(self.b_o.shape))
        if module.__class__ is GroupedQueryAttention and module.qk_norm == "head":
            for n in ("q_norm", "k_norm"):  # the same weight for every head: copied whole, gradients summed
                getattr(self.local, n).load_state_dict(getattr(module, n).state_dict())
                self.place(f"local.{n}.weight", f"{n}.weight", Shard(getattr(module, n).weight.shape, summed=True))

    def split_linear(self, name, full_name, full, dim, index, replicated=False, bias=True):
        """An nn.Linear holding `full`'s weight rows (dim 0) or columns (dim 1) at `index`."""
        weight = full.weight
        out_features, in_features = (len(index), weight.shape[1]) if dim == 0 else (weight.shape[0], len(index))
        layer = nn.Linear(in_features, out_features, bias=bias and full.bias is not None,
                          device=weight.device, dtype=weight.dtype)
        layer.weight = take(weight, dim, index)
        self.place(f"{name}.weight", f"{full_name}.weight", Shard(weight.shape, dim, index, replicated))
        if layer.bias is not None:  # only a column split (dim 0 of nn.Linear's weight) keeps a bias
            layer.bias = take(full.bias, 0, index)
            self.place(f"{name}.bias", f"{full_name}.bias", Shard(full.bias.shape, 0, index, replicated))
        return layer

    def local_mask(self, mask):
        """A mask's head axis, if it has one of size h, cut to this rank's heads."""
        if mask is not None and mask.dim() >= 3 and mask.shape[-3] == self.n_heads and self.n_heads > 1:
            return mask[..., self.heads.start:self.heads.stop, :, :]
        return mask

    def forward(self, x, mask=None, *, causal=False, positions=None):
        x = comm.copy_to_ranks(x, self.group)  # the backward sums x's gradient over ranks
        partial, _ = self.local(x, self.local_mask(mask), causal=causal, positions=positions)  # (..., T, d_model)
        out = comm.sum_over_ranks(partial, self.group)  # one all-reduce: (..., T, d_model) on every rank
        return out if self.b_o is None else out + self.b_o


class TensorParallelFeedForward(ShardedModule):
    """A FeedForward or GatedFeedForward split over the hidden width d_ff: W_1 (and W_gate, W_up)
    by columns, W_2 (W_down) by rows, one all-reduce. forward: (..., T, d_model) -> the same."""

    LAYERS = {FeedForward: (("linear_1", "linear_2"), ("linear_1",), "linear_2"),
              GatedFeedForward: (("W_gate", "W_up", "W_down"), ("W_gate", "W_up"), "W_down")}

    def __init__(self, module, group=None):
        super().__init__(group)
        if type(module) not in self.LAYERS:
            raise TypeError(f"expected a mha.torch.FeedForward or GatedFeedForward, got {type(module).__name__}")
        if isinstance(module, FeedForward) and module.dropout_hidden.p:
            raise ValueError(f"dropout={module.dropout_hidden.p}: the ranks would draw different masks")
        _, columns, rows = self.LAYERS[type(module)]
        d_ff = getattr(module, rows).in_features
        if d_ff % self.world_size:
            raise ValueError(f"d_ff={d_ff} is not divisible by world_size={self.world_size}: the feed-forward "
                             f"splits its hidden units evenly")
        per_rank = d_ff // self.world_size
        index = torch.arange(self.rank * per_rank, (self.rank + 1) * per_rank)
        self.local = copy.deepcopy(module)
        for name in columns:
            setattr(self.local, name, self.split(f"local.{name}", name, getattr(module, name), 0, index))
        self.local_out = self.split("local_out", rows, getattr(module, rows), 1, index, bias=False)
        setattr(self.local, rows, nn.Identity())
        full_out = getattr(module, rows)
        self.bias = None if full_out.bias is None else nn.Parameter(full_out.bias.detach().clone())
        if self.bias is not None:
            self.place("bias", f"{rows}.bias", Shard(self.bias.shape))
        self.rows = rows

    split = TensorParallelAttention.split_linear

    def forward(self, x):
        x = comm.copy_to_ranks(x, self.group)
        partial = self.local_out(self.local(x))  # (..., T, d_model): this rank's hidden units only
        out = comm.sum_over_ranks(partial, self.group)  # one all-reduce
        return out if self.bias is None else out + self.bias


def copy_whole(target, name, module):
    """Register a deep copy of `module` (a norm) in the sharded `target`, replicated on every rank."""
    setattr(target, name, None if module is None else copy.deepcopy(module))
    if module is not None:
        for parameter_name, parameter in module.named_parameters():
            target.place(f"{name}.{parameter_name}", f"{name}.{parameter_name}", Shard(parameter.shape))


class TensorParallelEncoderBlock(ShardedModule):
    """An EncoderBlock split by heads and by hidden units: two all-reduces per block (attention,
    feed-forward); LayerNorms whole on every rank. forward(x, mask=None, *, causal=False)."""

    def __init__(self, block, group=None):
        super().__init__(group)
        if block.dropout_attention.p:
            raise ValueError(f"dropout={block.dropout_attention.p}: the ranks would draw different masks")
        self.norm_first = block.norm_first
        self.attention = TensorParallelAttention(block.attention, group)
        self.feed_forward = TensorParallelFeedForward(block.feed_forward, group)
        copy_whole(self, "norm_1", block.norm_1)
        copy_whole(self, "norm_2", block.norm_2)

    def forward(self, x, mask=None, *, causal=False):
        if self.norm_first:
            x = x + self.attention(self.norm_1(x), mask, causal=causal)
            return x + self.feed_forward(self.norm_2(x))
        x = self.norm_1(x + self.attention(x, mask, causal=causal))
        return self.norm_2(x + self.feed_forward(x))


class TensorParallelLMBlock(ShardedModule):
    """An LMBlock (today's decoder block: grouped-query attention, a gated or plain feed-forward,
    RMSNorm or LayerNorm where its config puts them) split by heads and hidden units.
    forward(x, mask=None, *, positions=None) -> (..., T, d_model); causal, as LMBlock."""

    NORMS = ("attention_norm_in", "attention_norm_out", "feed_forward_norm_in", "feed_forward_norm_out")

    def __init__(self, block, group=None):
        super().__init__(group)
        self.attention = TensorParallelAttention(block.attention, group)
        self.feed_forward = TensorParallelFeedForward(block.feed_forward, group)
        for name in self.NORMS:
            copy_whole(self, name, getattr(block, name))

    @staticmethod
    def around(norm_in, norm_out, sublayer, x):
        y = sublayer(x if norm_in is None else norm_in(x))
        return x + (y if norm_out is None else norm_out(y))

    def forward(self, x, mask=None, *, positions=None):
        x = self.around(self.attention_norm_in, self.attention_norm_out,
                        lambda a: self.attention(a, mask, causal=True, positions=positions), x)
        return self.around(self.feed_forward_norm_in, self.feed_forward_norm_out, self.feed_forward, x)


SPLITS = {MultiHeadAttention: TensorParallelAttention, GroupedQueryAttention: TensorParallelAttention,
          EncoderBlock: TensorParallelEncoderBlock, LMBlock: TensorParallelLMBlock,
          FeedForward: TensorParallelFeedForward, GatedFeedForward: TensorParallelFeedForward}


def tensor_parallel(module, group=None):
    """This rank's part of `module` split by heads (attention) and hidden units (feed-forward).

    module: a MultiHeadAttention, GroupedQueryAttention, EncoderBlock, LMBlock, FeedForward or
    GatedFeedForward, the same on every rank (same seed, or loaded weights). Call it on every rank
    of the process group."""
    split = SPLITS.get(type(module))
    if split is None:
        raise TypeError(f"tensor_parallel splits a {', '.join(t.__name__ for t in SPLITS)}; "
                        f"got {type(module).__name__}")
    return split(module, group)


def torch_tensor_parallel(module, mesh):
    """The same split made by PyTorch's own `parallelize_module` over a 1-D DeviceMesh: a deep copy
    of `module` (MultiHeadAttention, GroupedQueryAttention with P dividing h_kv, or EncoderBlock)
    with ColwiseParallel on W_Q, W_K, W_V (and the feed-forward's first layer) and RowwiseParallel
    on W_O (and its second), and the head counts set to this rank's, as PyTorch's tutorial does. Per-head
    QK-norms get SequenceParallel over the head axis: weights replicated as DTensors, whose gradients
    DTensor sums over the ranks (a plain copy's would stay this rank's part)."""
    n_heads, n_kv_heads, _, _ = as_grouped(module.attention if isinstance(module, EncoderBlock) else module)
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module,
    )

    world_size = mesh.size()
    ours = copy.deepcopy(module)
    attention = ours.attention if isinstance(ours, EncoderBlock) else ours
    check_heads_split(n_heads, n_kv_heads, world_size)
    if n_kv_heads % world_size:
        raise ValueError(f"parallelize_module cannot replicate key/value heads: n_kv_heads={n_kv_heads} "
                         f"must be divisible by world_size={world_size}")
    plan = {"W_q": ColwiseParallel(), "W_k": ColwiseParallel(), "W_v": ColwiseParallel(), "W_o": RowwiseParallel()}
    if getattr(attention, "qk_norm", None) == "head":  # replicated weights on inputs split by heads (axis -3):
        # their gradients come out partial and DTensor sums them over the ranks (torchtitan's plan for Qwen3)
        plan.update({n: SequenceParallel(sequence_dim=-3, use_local_output=True) for n in ("q_norm", "k_norm")})
    if isinstance(ours, EncoderBlock):
        plan = {f"attention.{name}": style for name, style in plan.items()}
        plan.update({"feed_forward.linear_1": ColwiseParallel(), "feed_forward.linear_2": RowwiseParallel()})
    parallelize_module(ours, mesh, plan)
    attention.n_heads = n_heads // world_size
    if isinstance(attention, GroupedQueryAttention):
        attention.n_kv_heads = n_kv_heads // world_size
    return ours
