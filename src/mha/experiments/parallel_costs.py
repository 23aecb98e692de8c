"""What splitting attention across devices costs: compute against communication (chapter 15).

A cost model on paper, pure Python: no process is started and nothing is timed. For one
Transformer layer, in a training step (forward, backward, and the weight gradients' all-reduce)
or in the forward pass alone, it counts the floating-point operations (FLOPs) each of P
devices computes and the bytes each puts on the wire, then turns both into seconds with a
GPU's peak speed and a link's bandwidth. The ratio of the two says whether communication
can hide behind the compute (ratio < 1) or dominates it (ratio > 1).

Letters as in the rest of the course: P devices (ranks), B batch, T sequence, d = d_model,
h query heads, h_kv key/value heads, d_head, d_ff the feed-forward's hidden width.

Two numbers are kept apart (as in `mha.distributed.comm`):
- the payload: the elements a rank HANDS to a collective;
- the wire bytes: what the algorithm then sends from that rank. A ring all-reduce sends
  2(P - 1)/P of its payload per rank [patarasuk2009bandwidth]; an all-to-all keeps 1/P of its
  payload at home and sends (P - 1)/P; a ring step (send/recv) sends all of it.

Every constant names its source in a comment and in `CONSTANTS`, with its citation key
in book/references.bib.
"""

import numbers
from dataclasses import dataclass

from mha import validate

SCHEMES = ("tensor", "ulysses", "ring")
BF16_BYTES = 2  # bfloat16: 16 bits per element


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only Transformer's layer, as its published config gives it."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_ff: int
    context: int
    cite: str

    def __post_init__(self):
        for field in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_head", "d_ff", "context"):
            validate.check_int(field, getattr(self, field))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")


@dataclass(frozen=True)
class Link:
    """A link between two GPUs: bytes per second in each direction."""

    name: str
    bytes_per_s: float
    cite: str


@dataclass(frozen=True)
class Gpu:
    """A GPU's peak dense throughput in the dtype the model runs in."""

    name: str
    flops_per_s: float
    cite: str


# Llama 2 [touvron2023llama2], Table 1 and the configs published with the weights
# (meta-llama/Llama-2-7b-hf and Llama-2-70b-hf, config.json: hidden_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, intermediate_size, max_position_embeddings).
# 70B uses grouped-query attention: 64 query heads share 8 key/value heads.
LLAMA2_7B = ModelShape("Llama-2-7B", d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                       d_head=128, d_ff=11008, context=4096, cite="touvron2023llama2")
LLAMA2_70B = ModelShape("Llama-2-70B", d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                        d_head=128, d_ff=28672, context=4096, cite="touvron2023llama2")
MODELS = {m.name: m for m in (LLAMA2_7B, LLAMA2_70B)}

# NVIDIA H100 SXM: 989 TFLOP/s dense BF16 on the tensor cores (the datasheet's 1,979 is
# "with sparsity", twice the dense rate; the Hopper whitepaper gives 989.4 dense) [nvidia2022h100].
H100_SXM = Gpu("H100 SXM", flops_per_s=989e12, cite="nvidia2022h100")
GPU = H100_SXM

# NVLink 4 on H100 SXM: 900 GB/s total per GPU, i.e. 450 GB/s each way [nvidia2022h100].
# InfiniBand NDR: 400 Gb/s per port = 50 GB/s each way; one ConnectX-7 port per GPU, as in
# 8-GPU H100 servers with one 400 Gb/s adapter per GPU [nvidia2022connectx7].
NVLINK4 = Link("NVLink 4", bytes_per_s=450e9, cite="nvidia2022h100")
INFINIBAND_NDR = Link("InfiniBand NDR", bytes_per_s=400e9 / 8, cite="nvidia2022connectx7")
LINKS = {link.name: link for link in (NVLINK4, INFINIBAND_NDR)}

CONSTANTS = {
    **{f"{m.name} {field}": {"value": getattr(m, field), "unit": unit, "cite": m.cite}
       for m in MODELS.values()
       for field, unit in (("d_model", "features"), ("n_layers", "layers"), ("n_heads", "heads"),
                           ("n_kv_heads", "heads"), ("d_head", "features"), ("d_ff", "features"),
                           ("context", "positions"))},
    "H100 SXM dense BF16 peak": {"value": H100_SXM.flops_per_s, "unit": "FLOP/s", "cite": H100_SXM.cite},
    "NVLink 4 per GPU, each way": {"value": NVLINK4.bytes_per_s, "unit": "B/s", "cite": NVLINK4.cite},
    "InfiniBand NDR per port, each way": {"value": INFINIBAND_NDR.bytes_per_s, "unit": "B/s",
                                          "cite": INFINIBAND_NDR.cite},
    "bytes per BF16 element": {"value": BF16_BYTES, "unit": "B", "cite": None},  # 16 bits, by definition
    "ring all-reduce: wire / payload per rank": {"value": "2(P-1)/P", "unit": "", "cite": "patarasuk2009bandwidth"},
    "training step / forward FLOPs": {"value": 3, "unit": "", "cite": "kaplan2020scaling"},  # backward = 2 forwards
}


def as_model(model):
    """A ModelShape from itself or from its name in MODELS."""
    if isinstance(model, ModelShape):
        return model
    if model in MODELS:
        return MODELS[model]
    raise ValueError(f"model must be a ModelShape or one of {sorted(MODELS)}, got {model!r}")


def as_link(link):
    """A Link from itself or from its name in LINKS."""
    if isinstance(link, Link):
        return link
    if link in LINKS:
        return LINKS[link]
    raise ValueError(f"link must be a Link or one of {sorted(LINKS)}, got {link!r}")


def layer_flops(model, batch, seq_len, causal=True):
    """Forward FLOPs of one layer (attention and SwiGLU feed-forward) on B sequences of T tokens.

    A (m, n) @ (n, p) product costs 2 m n p FLOPs. Counted, with w = h * d_head (= d in Llama):
    - projections W_Q, W_O (d x w) and W_K, W_V (d x h_kv d_head): 2 B T d (2 w + 2 h_kv d_head);
    - scores Q K^T and the weighted sum of V: 2 x 2 B h T^2 d_head = 4 B T^2 w, halved when
      `causal` (only the keys at or before each query count);
    - SwiGLU's three d x d_ff matrices: 2 B T 3 d d_ff.
    Left out: norms, softmax, RoPE, residual adds (small next to the matrix products).
    """
    m = as_model(model)
    B, T = validate.check_int("batch", batch), validate.check_int("seq_len", seq_len)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__} {causal!r}")
    width = m.n_heads * m.d_head
    projections = 2 * B * T * m.d_model * (2 * width + 2 * m.n_kv_heads * m.d_head)
    attention = 4 * B * T * T * width // (2 if causal else 1)
    feed_forward = 2 * B * T * 3 * m.d_model * m.d_ff
    return projections + attention + feed_forward


def layer_weights(model):
    """The weights of one layer's matrices: W_Q, W_O (d x h d_head), W_K, W_V (d x h_kv d_head) and
    SwiGLU's three d x d_ff matrices (the norms' 2d weights left out)."""
    m = as_model(model)
    return 2 * m.d_model * (m.n_heads + m.n_kv_heads) * m.d_head + 3 * m.d_model * m.d_ff


def kv_heads_per_rank(model, P):
    """Key/value heads each rank holds when the heads are split over P ranks (tensor, Ulysses).

    h_kv / P when P divides h_kv; else, when h_kv divides P, one replica per rank (rank r
    holds kv head r // (P / h_kv)). Any other P is refused."""
    m = as_model(model)
    P = validate.check_int("P", P)
    if m.n_kv_heads % P == 0:
        return m.n_kv_heads // P
    if P % m.n_kv_heads == 0:
        return 1
    raise ValueError(f"P={P} ranks cannot share n_kv_heads={m.n_kv_heads} key/value heads: "
                     f"P must divide n_kv_heads or be a multiple of it")


def check_world_size(model, scheme, P, seq_len):
    """Refuse a P that `scheme` cannot use on this model and sequence length.

    tensor: P divides h (each rank h/P query heads), and kv heads split or replicate;
    ulysses: the same, and P divides T (T/P positions per rank);
    ring: P divides T/2 (two chunks of T/(2P) positions per rank, the zigzag split).
    """
    m = as_model(model)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    P, T = validate.check_int("P", P), validate.check_int("seq_len", seq_len)
    if scheme in ("tensor", "ulysses"):
        if m.n_heads % P:
            raise ValueError(f"{scheme} parallelism splits heads: n_heads={m.n_heads} is not divisible by P={P}")
        kv_heads_per_rank(m, P)
    if scheme == "ulysses" and T % P:
        raise ValueError(f"ulysses splits the sequence: seq_len={T} is not divisible by P={P}")
    if scheme == "ring" and T % (2 * P):
        raise ValueError(f"ring attention holds two chunks of T/(2P) positions per rank: "
                         f"seq_len={T} is not divisible by 2P={2 * P}")
    return P


PARTS = ("forward", "backward", "gradients")


def wire_elements_per_layer(model, scheme, P, batch, seq_len, part="forward"):
    """Elements one rank puts on the wire in one layer, in one part of a training step (see wire_bytes_per_layer)."""
    m = as_model(model)
    P = check_world_size(m, scheme, P, seq_len)
    B, T = validate.check_int("batch", batch), seq_len
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    if part == "gradients":
        if scheme != "tensor":  # every rank holds every weight: one all-reduce of all their gradients
            return layer_weights(m) * 2 * (P - 1) / P
        copies = P // m.n_kv_heads if P > m.n_kv_heads else 1  # replicas of one key/value head
        return 2 * m.d_model * m.d_head * 2 * (copies - 1) / copies  # its W_K, W_V columns, among the copies
    if scheme == "tensor":  # two all-reduces of (B, T, d): after attention, after the feed-forward
        payload = 2 * B * T * m.d_model
        return payload * 2 * (P - 1) / P  # the backward: the same two, for the gradient of the input
    if scheme == "ulysses":  # all-to-all of q, k, v (there) and of the output (back); the backward the same
        kv_heads = kv_heads_per_rank(m, P) * P  # h_kv, or P replicas when P > h_kv
        payload = B * (T // P) * m.d_head * (2 * m.n_heads + 2 * kv_heads)
        return payload * (P - 1) / P
    # ring: forward, P - 1 steps, each sends this rank's current k and v block of T/P positions;
    # backward, the blocks go round again (P - 1) and their gradients dk, dv travel P steps home
    block = 2 * B * m.n_kv_heads * (T // P) * m.d_head
    return (P - 1) * block if part == "forward" else (2 * P - 1) * block


def wire_bytes_per_layer(model, scheme, P, batch, seq_len, bytes_per_element=BF16_BYTES, part="forward"):
    """Bytes one rank puts on the wire in one layer, under `scheme` on P ranks, in one `part` of a step.

    part="forward", the forward pass:
    - "tensor" (heads split, Megatron-LM [shoeybi2019megatron]): two all-reduces of the
      (B, T, d) partial outputs, one after attention, one after the feed-forward:
      2 B T d x 2(P - 1)/P elements.
    - "ulysses" (DeepSpeed-Ulysses [jacobs2023deepspeed]): the sequence split by T/P, an
      all-to-all turns q, k, v into a split by heads and one turns the output back:
      B (T/P) d_head (2h + 2h_kv) x (P - 1)/P. The feed-forward works on the rank's own T/P
      positions and moves nothing.
    - "ring" (ring attention [liu2023ring]): P - 1 steps, each passing a k and a v block of
      T/P positions to the next rank: (P - 1) 2 B h_kv (T/P) d_head, whatever the split of the
      sequence (contiguous or zigzag) and the mask.
    part="backward": tensor and Ulysses the same again; the ring 2P - 1 blocks (4P - 2 tensors
    against the forward's 2(P - 1)): k and v go round again, and dk, dv travel P steps home.
    part="gradients": the all-reduce of the weights' gradients, once per step. Ulysses and the
    ring keep every weight on every rank: all of `layer_weights` x 2(P - 1)/P. Tensor parallelism
    splits the weights: only the W_K, W_V columns of a key/value head copied on P/h_kv ranks.
    When P > h_kv, tensor parallelism gives each rank a replica of one key/value head (no
    extra traffic: its all-reduces carry (B, T, d) whatever the kv heads), and so does
    Ulysses, whose all-to-all then carries P key/value heads instead of h_kv.
    Megatron's sequence parallelism [korthikanti2022reducing] turns each all-reduce of
    "tensor" into a reduce-scatter and an all-gather, (P - 1)/P each: the same wire bytes.
    """
    if isinstance(bytes_per_element, bool) or not isinstance(bytes_per_element, numbers.Real) \
            or not bytes_per_element > 0:
        raise ValueError(f"bytes_per_element must be a number > 0, got {bytes_per_element!r}")
    return wire_elements_per_layer(model, scheme, P, batch, seq_len, part) * bytes_per_element


@dataclass(frozen=True)
class LayerTimes:
    """One layer on one of P ranks, a training step or a forward pass: compute and communication, in seconds.
    comm_s includes gradient_s, the weight gradients' all-reduce (0 for a forward pass)."""

    model: str
    scheme: str
    link: str
    P: int
    compute_s: float
    comm_s: float
    gradient_s: float = 0.0
    training: bool = True

    @property
    def ratio(self):
        """Communication time / compute time: above 1, the wire is the bottleneck."""
        return self.comm_s / self.compute_s


def layer_times(model, scheme, P, link, batch=1, seq_len=4096, gpu=GPU, causal=True, training=True):
    """Seconds one rank spends computing and communicating in one layer: a training step (forward,
    backward, gradients' all-reduce), or with training=False the forward pass alone.

    compute: layer_flops / P / the GPU's peak, an ideal even split at peak speed (it leaves
    out the key/value projections that replicas repeat when P > h_kv, and assumes a split that
    balances causal ring attention, as the zigzag one does [dubey2024llama3]), times 3 in a
    training step: the backward computes the gradients of the inputs and of the weights, each
    about as much as the forward [kaplan2020scaling]. communication: wire_bytes_per_layer of
    each part / the link's bandwidth in one direction, with no latency and no overlap.
    """
    m, lk = as_model(model), as_link(link)
    if not isinstance(gpu, Gpu):
        raise TypeError(f"gpu must be a Gpu, got {type(gpu).__name__}")
    if not isinstance(training, bool):
        raise TypeError(f"training must be True or False, got {type(training).__name__} {training!r}")
    parts = PARTS if training else ("forward",)
    wire = {part: wire_bytes_per_layer(m, scheme, P, batch, seq_len, part=part) for part in parts}
    compute = layer_flops(m, batch, seq_len, causal) * (3 if training else 1) / P / gpu.flops_per_s
    return LayerTimes(m.name, scheme, lk.name, P, compute_s=compute, comm_s=sum(wire.values()) / lk.bytes_per_s,
                      gradient_s=wire.get("gradients", 0.0) / lk.bytes_per_s, training=training)


def valid_world_sizes(model, scheme, seq_len, P_range=range(2, 65)):
    """Every P in P_range that `scheme` can use on `model` at `seq_len`."""
    valid = []
    for P in P_range:
        try:
            check_world_size(model, scheme, P, seq_len)
        except ValueError:
            continue
        valid.append(P)
    return valid


def cost_table(models=tuple(MODELS), links=tuple(LINKS), schemes=SCHEMES, P_range=range(2, 65),
               batch=1, seq_len=None, training=True):
    """LayerTimes for every model, link, scheme and every valid P of P_range (seq_len: each
    model's context by default), in that order; a training step, or the forward pass alone."""
    rows = []
    for model in map(as_model, models):
        T = model.context if seq_len is None else seq_len
        for link in links:
            for scheme in schemes:
                rows += [layer_times(model, scheme, P, link, batch, T, training=training)
                         for P in valid_world_sizes(model, scheme, T, P_range)]
    return rows


def first_crossing(rows, model, scheme, link):
    """The smallest P of `rows` where communication takes at least as long as the compute
    for (model, scheme, link), or None if it never does in the table."""
    m, lk = as_model(model).name, as_link(link).name
    hits = [r.P for r in rows if (r.model, r.scheme, r.link) == (m, scheme, lk) and r.ratio >= 1]
    return min(hits) if hits else None



def batch_to_hide(model, scheme, P, link, seq_len=None, largest=4096, training=True):
    """The fewest sequences B per step (1 .. largest) for which one rank's communication takes less
    time than its compute, or None. The compute and the activations' traffic grow with B; the
    weight gradients' all-reduce is paid once per step, whatever B, so more tokens per step hide it."""
    m = as_model(model)
    T = m.context if seq_len is None else seq_len
    largest = validate.check_int("largest", largest)
    if layer_times(m, scheme, P, link, largest, T, training=training).ratio >= 1:
        return None
    low, high = 0, largest  # the ratio falls as B grows: ratio(high) < 1, and B = low is not enough (or 0)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if layer_times(m, scheme, P, link, mid, T, training=training).ratio < 1 else (mid, high)
    return high


def ring_step_times(model, P, link, batch=1, seq_len=None, gpu=GPU, causal=True):
    """(compute_s, transfer_s) of one step of ring attention's forward pass on one rank: the attention of its
    T/P queries on one block of T/P keys, 4 B h (T/P)^2 d_head FLOPs, halved under a causal mask (on average,
    with a balanced split), against one key/value block, 2 B h_kv (T/P) d_head in bfloat16, on the link."""
    m, lk = as_model(model), as_link(link)
    T = m.context if seq_len is None else seq_len
    P = check_world_size(m, "ring", P, T)
    B = validate.check_int("batch", batch)
    flops = 4 * B * m.n_heads * (T // P) ** 2 * m.d_head / (2 if causal else 1)
    return flops / gpu.flops_per_s, wire_bytes_per_layer(m, "ring", P, B, T) / (P - 1) / lk.bytes_per_s


def ring_timeline(compute_s, transfer_s, steps):
    """One rank's ring forward when each step sends on the block it holds while it computes with it:
    ([(start, end)] of the steps' compute, [(start, end)] of the transfers of the next block). Step s + 1
    starts at the later of the end of step s and the arrival of its block, transfer_s after step s began.
    The whole takes steps x compute_s when transfer_s <= compute_s (the wire hides), else
    (steps - 1) x transfer_s + compute_s (the compute waits)."""
    steps = validate.check_int("steps", steps)
    compute, transfers, start = [], [], 0.0
    for s in range(steps):
        compute.append((start, start + compute_s))
        if s < steps - 1:
            transfers.append((start, start + transfer_s))
            start = max(start + compute_s, start + transfer_s)
    return compute, transfers
