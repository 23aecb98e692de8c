"""The library's layout: public names, imports that only go down, any module importable first.

src/mha/README.md draws the house; these tests hold it up.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mha.numpy as mn
import mha.torch as mt

SRC = Path(__file__).resolve().parent.parent / "src"
MODULES = sorted(".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
                 for p in (SRC / "mha").rglob("*.py"))

# The public names of the two faces: a contract that the book, the checks and readers rely on.
NUMPY_NAMES = [
    "as_float_array", "attention_at_offset", "attention_shape", "causal_mask", "head_attention", "masked_softmax",
    "masked_softmax_", "merge_heads", "multihead_attention", "multihead_attention_loop", "padding_mask", "project",
    "scaled_dot_product_attention", "self_attention", "softmax", "split_heads", "symmetric_attention", "transpose",
    "ATTENTION_PARAMS", "BLOCK_PARAMS", "DECODER_BLOCK_PARAMS", "OPTIONAL_PARAMS", "decoder", "decoder_block",
    "encoder", "encoder_block", "feed_forward", "gelu", "layer_norm", "relu", "chunked_attention",
    "repeat_kv", "rotary_embedding", "apply_rotary", "grouped_query_attention", "KVCache", "kv_cache_bytes",
    "attend_with_cache", "causal_mask_after",
    "sinusoidal_positions", "sinusoidal_shift", "add_positions", "alibi_slopes", "alibi_bias",
    "decoder_only_transformer", "log_softmax", "cross_entropy", "causal_lm_loss", "warmup_factor", "generate_greedy",
    "rms_norm", "gated_feed_forward", "swiglu", "geglu", "soft_cap", "sliding_window_mask", "rotary_frequencies",
    "rotary_at", "transformer_lm", "filter_logits", "generate", "apply_temperature", "top_k_filter", "top_p_filter",
    "loss_to_bits_per_character",
    "shard_by_heads", "tensor_parallel_attention", "all_reduce", "all_to_all", "ulysses_attention", "sequence_chunks",
    "attention_partial", "merge_partials", "ring_attention", "all_reduce_bytes", "payload_per_layer", "wire_bytes",
]
TORCH_NAMES = [
    "scaled_dot_product_attention", "chunked_attention", "split_heads", "merge_heads", "causal_mask",
    "padding_mask", "masked_softmax", "SymmetricAttention", "HeadAttention", "MultiHeadAttentionLoop",
    "MultiHeadAttention", "EncoderBlock", "Encoder", "DecoderBlock", "Decoder", "layer_norm", "FeedForward",
    "repeat_kv", "rotary_embedding", "apply_rotary", "GroupedQueryAttention", "KVCache", "kv_cache_bytes",
    "attend_with_cache", "causal_mask_after",
    "sinusoidal_positions", "add_positions", "alibi_slopes", "alibi_bias", "LearnedPositions", "SinusoidalPositions",
    "DecoderOnlyTransformer", "cross_entropy", "causal_lm_loss", "warmup_factor", "warmup_schedule", "generate_greedy",
    "default_device", "synchronize", "RMSNorm", "GatedFeedForward", "SwiGLU", "GeGLU", "soft_cap",
    "sliding_window_mask", "rotary_frequencies", "RotaryTables", "TransformerLM", "LMConfig", "LMBlock",
    "from_transformers", "positions_from_mask", "filter_logits", "generate", "apply_temperature", "top_k_filter",
    "top_p_filter",
]


@pytest.mark.parametrize("face,names", [(mn, NUMPY_NAMES), (mt, TORCH_NAMES)], ids=["numpy", "torch"])
def test_every_public_name_is_importable_from_its_face(face, names):
    missing = [n for n in names if not hasattr(face, n) or n not in face.__all__]
    assert not missing, f"{face.__name__} lacks {missing}"
    assert all(hasattr(face, n) for n in face.__all__)


def imports_of(path):
    """The mha modules that a file imports, and the line of its last top-level import."""
    tree = ast.parse(path.read_text())
    found, last_import, first_other = set(), 0, None
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.module == "mha":
                names = [f"mha.{a.name}" for a in node.names]
            found |= {n for n in names if n.startswith("mha")}
            last_import = node.lineno
        elif first_other is None and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            first_other = node.lineno
    return found, last_import, first_other


def module_file(name):
    path = SRC.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize("module", MODULES)
def test_imports_come_first_in_every_file(module):
    _, last_import, first_other = imports_of(module_file(module))
    assert first_other is None or last_import < first_other, (
        f"{module} imports at line {last_import}, after code at line {first_other}: imports go at the top")


def test_there_is_no_import_circle():
    """Depth-first search over the graph of mha modules (a package's __init__ aside,
    since importing a submodule runs it: its edges are the re-exports)."""
    graph = {}
    for module in MODULES:
        found, _, _ = imports_of(module_file(module))
        graph[module] = {n for n in found if n in MODULES and n != module}
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                pytest.fail("import circle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for module in MODULES:
        if module not in state:
            visit(module, [module])


def test_faces_never_import_the_experiments_or_the_checks():
    for module in MODULES:
        if module.startswith(("mha.numpy", "mha.torch", "mha.validate")):
            found, _, _ = imports_of(module_file(module))
            assert not {n for n in found if n.startswith(("mha.experiments", "mha.checks", "mha.distributed"))}, module


def test_distributed_imports_only_the_torch_face_and_the_ground_floor():
    """mha.distributed is PyTorch only: it builds on the torch face, never on NumPy's or above it."""
    for module in MODULES:
        if module.startswith("mha.distributed"):
            found, _, _ = imports_of(module_file(module))
            outside = {n for n in found if not n.startswith(("mha.distributed", "mha.torch", "mha.validate"))}
            assert not outside, (module, outside)


@pytest.mark.parametrize("package", ["mha.numpy", "mha.torch"])
def test_a_face_only_re_exports(package):
    tree = ast.parse(module_file(package).read_text())
    kinds = {type(node).__name__ for node in tree.body[1:]}
    assert kinds <= {"ImportFrom", "Assign"}, kinds
    assert any(isinstance(n, ast.Assign) and n.targets[0].id == "__all__" for n in tree.body)


# Every module importable first: each imported in a child forked from a parent that has imported
# only the third-party packages the library uses, so that no mha module was loaded before it and
# the interpreters do not pay for torch's import 80 times.
FORKED_IMPORTS = r"""
import importlib, json, os, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
assert not [m for m in sys.modules if m == "mha" or m.startswith("mha.")], "a third-party package imported mha"
results = {}
for module in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            message = "ok"
        except BaseException as error:
            message = f"{type(error).__name__}: {error}"
        os.write(write, message.encode()[:4000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        results[module] = pipe.read().decode() or "the child died"
    os.waitpid(pid, 0)
print(json.dumps(results))
"""


def third_party_imports():
    """The top-level packages that the library's modules import at their top, other than mha and the standard library."""
    found = set()
    for module in MODULES:
        for node in ast.parse(module_file(module).read_text()).body:
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return sorted(found - set(sys.stdlib_module_names) - {"mha"})


@pytest.fixture(scope="module")
def first_imports():
    run = subprocess.run([sys.executable, "-c", FORKED_IMPORTS, json.dumps(MODULES), *third_party_imports()],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("module", MODULES)
def test_every_module_can_be_imported_first(module, first_imports):
    assert first_imports[module] == "ok", f"{module}, imported first: {first_imports[module]}"
