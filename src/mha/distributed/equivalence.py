"""Each scheme against one process: the functions that tests and chapter 15 launch.

Every rank builds the same single-process module and inputs from the case's seed, computes
the reference output and gradients itself, then runs the scheme on its part and compares.
A case is a dict:
    scheme:  "tensor", "torch_tensor" (PyTorch's parallelize_module), "tensor_vs_torch" (ours
             against PyTorch's, not against one process), "ulysses" or "ring"
    module:  "mha", "gqa" (RoPE, grouped keys), "encoder" (EncoderBlock) or "lm" (a Llama LMBlock)
    seed, batch, seq_len, d_model, n_heads, n_kv_heads (gqa, lm), d_ff (encoder, lm),
    causal, padding (True: the first sequence of the batch is left-padded by `pad` positions,
    so its first queries may attend to nothing), layout (ring), dtype ("float32" or "float64"),
    qk_norm (gqa, lm: None, "head" as Qwen3, or "all" as OLMo 2), steps (tensor_training).
    Scheme "tensor_training" (and "torch_tensor_training", PyTorch's split) trains the split and
    the single-process module `steps` steps of SGD on the same data and compares the weights.
The result, per rank: the relative error of the output and of every gradient (input and
parameters), max |ours - one process| / max |one process| (a parameter's gradient measured
against its layer's, `layer_scales`), and the payload and work counted.
"""

import copy

import torch
import torch.distributed as dist

import mha.distributed.comm as comm
from mha.distributed.launcher import rank_device
from mha.distributed.ring import RingAttention
from mha.distributed.sequence import gather_sequence, split_sequence
from mha.distributed.tensor import tensor_parallel, torch_tensor_parallel
from mha.distributed.ulysses import UlyssesAttention
from mha.torch.attention import MultiHeadAttention
from mha.torch.blocks import EncoderBlock
from mha.torch.grouped import GroupedQueryAttention
from mha.torch.lm import LMBlock, LMConfig

DEFAULTS = dict(seed=0, batch=2, seq_len=16, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, causal=False,
                padding=False, pad=5, layout="zigzag", dtype="float32", qk_norm=None, steps=3)


SCHEMES = ("tensor", "torch_tensor", "tensor_vs_torch", "tensor_training", "torch_tensor_training", "ulysses", "ring")


def full_case(case):
    unknown = set(case) - set(DEFAULTS) - {"scheme", "module"}
    if unknown:
        raise ValueError(f"unknown case keys {sorted(unknown)}; a case takes scheme, module and {sorted(DEFAULTS)}")
    return {**DEFAULTS, **case}


def build_module(case, device):
    """The single-process module of a case, drawn from its seed (the same on every rank), with
    weights larger than the default initialisation so that a wrong head shows."""
    torch.manual_seed(case["seed"])
    options = dict(device=device, dtype=getattr(torch, case["dtype"]))
    d, h = case["d_model"], case["n_heads"]
    kind = case["module"]
    if kind == "mha":
        module = MultiHeadAttention(d, h, **options)
    elif kind == "gqa":
        module = GroupedQueryAttention(d, h, case["n_kv_heads"], rope_base=10000.0, qk_norm=case["qk_norm"],
                                       **options)
    elif kind == "encoder":
        module = EncoderBlock(d, h, case["d_ff"], norm_first=True, activation="gelu", **options)
    elif kind == "lm":
        config = LMConfig(vocab_size=8, d_model=d, n_layers=1, d_ff=case["d_ff"],
                          attention=dict(n_heads=h, n_kv_heads=case["n_kv_heads"], rope_base=10000.0,
                                         qk_norm=case["qk_norm"]))
        module = LMBlock(config, 0, **options)
    else:
        raise ValueError(f'module must be "mha", "gqa", "encoder" or "lm", got {kind!r}')
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 0.3)
    return module


def make_inputs(case, device):
    """x (B, T, d_model), the key-padding mask (B, T) or None (True = may attend), and the weights
    g of the loss sum(out * g), all from the case's seed."""
    generator = torch.Generator().manual_seed(case["seed"] + 1)
    dtype = getattr(torch, case["dtype"])
    shape = (case["batch"], case["seq_len"], case["d_model"])
    x = torch.randn(shape, generator=generator, dtype=dtype).to(device)
    g = torch.randn(shape, generator=generator, dtype=dtype).to(device)
    keep = None
    if case["padding"]:
        keep = torch.ones(case["batch"], case["seq_len"], dtype=torch.bool)
        keep[0, :case["pad"]] = False  # left padding: the first queries of sequence 0 see no key
        keep = keep.to(device)
    return x, keep, g


def run_single(module, case, x, keep):
    """The single-process output (B, T, d_model)."""
    mask = None if keep is None else keep[:, None, None, :]  # (B, 1, 1, T)
    kind = case["module"]
    if kind == "mha":
        return module(x, mask=mask, causal=case["causal"])
    if kind == "encoder":
        return module(x, mask, causal=case["causal"])
    if kind == "gqa":
        return module(x, mask, causal=case["causal"])[0]
    return module(x, mask)[0]  # LMBlock: causal always


def relative_error(ours, reference, scale=None):
    """max |ours - reference| / scale, the scale being max |reference| unless given."""
    scale = reference.abs().max().item() if scale is None else scale
    return (ours - reference).abs().max().item() / (scale if scale > 0 else 1.0)


def layer_scales(grads):
    """{parameter name: the largest |gradient| of its layer, weight and bias together}.

    A layer's bias is measured against its layer: the key projection's bias has a gradient of
    exactly zero in exact arithmetic (softmax ignores a constant added to a row of scores, and
    q . b_K is one), so against itself it would compare rounding with rounding."""
    largest = {}
    for name, grad in grads.items():
        layer = name.rpartition(".")[0]
        largest[layer] = max(largest.get(layer, 0.0), grad.abs().max().item())
    return {name: largest[name.rpartition(".")[0]] for name in grads}


def reference_run(case, device):
    module = build_module(case, device)
    x, keep, g = make_inputs(case, device)
    x.requires_grad_(True)
    out = run_single(module, case, x, keep)
    (out * g).sum().backward()
    grads = {name: p.grad for name, p in module.named_parameters()}
    return module, x, keep, g, out.detach(), x.grad, grads


def tensor_run(module, case, x, keep, g, torch_mesh=None):
    """Output, x's gradient and the whole parameter gradients of tensor parallelism (ours, or
    PyTorch's parallelize_module when torch_mesh is given)."""
    if case["module"] == "lm" and case["causal"] is False:
        case = {**case, "causal": True}
    x = x.detach().clone().requires_grad_(True)
    split = tensor_parallel(module) if torch_mesh is None else torch_tensor_parallel(module, torch_mesh)
    out = run_single(split, case, x, keep) if torch_mesh is not None else run_split(split, case, x, keep)
    (out * g).sum().backward()
    if torch_mesh is None:
        grads = split.full_gradients()
    else:
        grads = {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
                 for name, p in split.named_parameters()}
    return (out.detach(), x.grad, grads), split


def replica_errors(split, ref_grads):
    """After split.reduce_replicated_gradients(), each replicated key/value head's gradient on this
    rank against its slice of the single-process gradient, and each per-head QK-norm's against the
    whole: {"grad NAME (replica)": error, "grad NAME (summed)": error}."""
    split.reduce_replicated_gradients()
    scales = layer_scales(ref_grads)
    found = {}
    for parameter, full_name, shard in split.all_shards():
        if shard.summed:
            reference = ref_grads[full_name]
            found[f"grad {full_name} (summed)"] = relative_error(parameter.grad, reference, scales[full_name])
        elif shard.replicated_slice:
            reference = ref_grads[full_name].index_select(shard.dim, shard.index.to(parameter.device))
            found[f"grad {full_name} (replica)"] = relative_error(parameter.grad, reference, scales[full_name])
    return found


def run_split(split, case, x, keep):
    mask = None if keep is None else keep[:, None, None, :]
    if case["module"] == "lm":
        return split(x, mask)
    return split(x, mask, causal=case["causal"])


def sequence_run(module, case, x, keep, g):
    """Output, x's gradient and parameter gradients (summed over ranks) of Ulysses or the ring."""
    layout = "contiguous" if case["scheme"] == "ulysses" else case["layout"]
    scheme = UlyssesAttention(module) if case["scheme"] == "ulysses" else RingAttention(module, layout)
    module.zero_grad(set_to_none=True)
    x_local = split_sequence(x.detach(), layout).requires_grad_(True)  # (B, T / P, d_model)
    out_local = scheme(x_local, keep, causal=case["causal"])  # (B, T / P, d_model)
    (out_local * split_sequence(g, layout)).sum().backward()
    out = gather_sequence(out_local.detach(), layout)  # (B, T, d_model)
    x_grad = gather_sequence(x_local.grad, layout)
    grads = {}
    for name, p in module.named_parameters():
        grad = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(grad)  # the sum over ranks of each rank's part (not counted: a check)
        grads[name] = grad
    return out, x_grad, grads


LEARNING_RATE = 0.02  # SGD on the loss sum(out * g): the weights move by a few tenths in 3 steps


def training_run(module, case, device, torch_mesh=None):
    """`steps` steps of SGD on the split (ours, or PyTorch's with torch_mesh) and on a copy of the
    single-process module, each step on new inputs; then {"weight NAME": each local weight against its
    place in the single-process weights, "copies NAME": how far the ranks' copies of a weight held
    whole on every rank are from rank 0's}, relative to the largest single-process weight."""
    reference = copy.deepcopy(module)
    split = tensor_parallel(module) if torch_mesh is None else torch_tensor_parallel(module, torch_mesh)
    ours, theirs = (torch.optim.SGD(m.parameters(), lr=LEARNING_RATE, foreach=False) for m in (split, reference))
    for step in range(case["steps"]):
        x, keep, g = make_inputs({**case, "seed": case["seed"] + 1000 * step}, device)
        for model, optimizer in ((reference, theirs), (split, ours)):
            optimizer.zero_grad(set_to_none=True)
            if model is reference or torch_mesh is not None:
                out = run_single(model, case, x, keep)
            else:
                out = run_split(model, case, x, keep)
            (out * g).sum().backward()
            if model is split and torch_mesh is None:
                split.reduce_replicated_gradients()  # before the step, as its docstring asks
            optimizer.step()
    whole = dict(reference.named_parameters())
    found, copies = {}, {}
    if torch_mesh is None:
        for parameter, full_name, shard in split.all_shards():
            target = whole[full_name].detach()
            if shard.dim is not None:
                target = target.index_select(shard.dim, shard.index.to(target.device))
            else:
                copies[full_name] = parameter.detach()
            scale = whole[full_name].abs().max().item()
            found[f"weight {full_name}"] = relative_error(parameter.detach(), target, scale)
    else:
        for name, parameter in split.named_parameters():
            value = parameter.detach()
            if hasattr(value, "full_tensor"):
                if all(p.is_replicate() for p in value.placements):
                    copies[name] = value.to_local()
                value = value.full_tensor()
            else:
                copies[name] = value
            found[f"weight {name}"] = relative_error(value, whole[name].detach())
    for name, value in copies.items():
        gathered = [torch.empty_like(value) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, value.contiguous())
        found[f"copies {name}"] = max(relative_error(other, gathered[0], whole[name].abs().max().item())
                                      for other in gathered)
    return found


def errors(ours, reference):
    (out, x_grad, grads), (ref_out, ref_x_grad, ref_grads) = ours, reference
    result = {"output": relative_error(out, ref_out), "grad x": relative_error(x_grad, ref_x_grad)}
    missing = set(ref_grads) - set(grads)
    if missing:
        raise AssertionError(f"gradients missing for {sorted(missing)}")
    scales = layer_scales(ref_grads)
    result.update({f"grad {name}": relative_error(grads[name], ref, scales[name]) for name, ref in ref_grads.items()})
    return result


def run_case(case, device, mesh=None):
    """One case on this rank: {"errors": {...}, "traffic": Traffic.as_dict()} (the forward and
    backward of the scheme only: the checks' own gathers are not counted)."""
    case = full_case(case)
    module, x, keep, g, ref_out, ref_x_grad, ref_grads = reference_run(case, device)
    with comm.count_payload() as traffic:
        split = None
        if case["scheme"] == "tensor":
            ours, split = tensor_run(module, case, x, keep, g)
        elif case["scheme"] == "torch_tensor":
            ours, _ = tensor_run(module, case, x, keep, g, torch_mesh=mesh)
        elif case["scheme"] == "tensor_vs_torch":  # ours against PyTorch's parallelize_module, directly
            ours, _ = tensor_run(module, case, x, keep, g)
            (ref_out, ref_x_grad, ref_grads), _ = tensor_run(module, case, x, keep, g, torch_mesh=mesh)
        elif case["scheme"] in ("tensor_training", "torch_tensor_training"):
            mesh_or_none = mesh if case["scheme"] == "torch_tensor_training" else None
            return {"errors": training_run(module, case, device, mesh_or_none), "traffic": traffic.as_dict()}
        elif case["scheme"] in ("ulysses", "ring"):
            ours = sequence_run(module, case, x, keep, g)
        else:
            raise ValueError(f'scheme must be one of {SCHEMES}, got {case["scheme"]!r}')
    found = errors(ours, (ref_out, ref_x_grad, ref_grads))
    if split is not None:  # replicas summed, outside the counted step: an optimizer's concern
        found.update(replica_errors(split, ref_grads))
    return {"errors": found, "traffic": traffic.as_dict()}


def run_cases(rank, world_size, cases):
    """Every case on this rank (a function for mha.distributed.launch): a list of results."""
    device = rank_device()
    mesh = None
    if any(case.get("scheme") in ("torch_tensor", "tensor_vs_torch", "torch_tensor_training") for case in cases):
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (world_size,))
    return [run_case(case, device, mesh) for case in cases]
