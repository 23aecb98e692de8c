"""The library's layout: public names, imports that only go down, any module importable first.

src/mha/README.md draws the house; these tests hold it up.
"""

import ast
import json
import re
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


# The house's rules -------------------------------------------------------------------------------

REPOSITORY = SRC.parent
SIZE_LIMIT = 400  # lines per Python file in src/, tools/, benchmarks/ and tests/
# Files allowed over the limit, each with its reason (a test below fails when one no longer needs it)
OVER_THE_LIMIT = {}
ROOMS = ("src", "tools", "benchmarks", "tests")


def python_files(*rooms):
    return sorted(p for room in rooms for p in (REPOSITORY / room).rglob("*.py")
                  if "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts)


def test_no_file_is_over_the_size_limit():
    """A file past SIZE_LIMIT lines is two rooms in one: split it by role, or list it with its reason."""
    over = {str(p.relative_to(REPOSITORY)): n for p in python_files(*ROOMS)
            if (n := len(p.read_text().splitlines())) > SIZE_LIMIT}
    unlisted = {path: n for path, n in over.items() if path not in OVER_THE_LIMIT}
    assert not unlisted, f"over {SIZE_LIMIT} lines (split by role, or list in OVER_THE_LIMIT with the reason): {unlisted}"
    assert all(reason.strip() for reason in OVER_THE_LIMIT.values())
    stale = sorted(set(OVER_THE_LIMIT) - set(over))
    assert not stale, f"listed in OVER_THE_LIMIT but no longer over {SIZE_LIMIT} lines: remove them from the list: {stale}"


def imported_modules(path, package):
    """Every module that a file imports, at any depth (functions included), relative imports resolved."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def package_of(module):
    return module if module_file(module).name == "__init__.py" else module.rsplit(".", 1)[0]


def modules_imported_by(prefix):
    """{module: the mha modules it imports} for the library's modules under `prefix`."""
    return {m: {i for i in imported_modules(module_file(m), package_of(m)) if i.startswith("mha")}
            for m in MODULES if m == prefix or m.startswith(prefix + ".")}


def face_order(face):
    """The modules of a face in the order src/mha/README.md draws them: [[names on one line], ...]."""
    groups, inside = [], False
    for line in (SRC / "mha" / "README.md").read_text().splitlines():
        if line.startswith(f"  {face}/"):
            inside = True
        elif inside and re.match(r"^  \S", line):
            break
        elif inside and (found := re.match(r"^    ((?:\w+(?:\.py|/))(?:, \w+(?:\.py|/))*)", line)):
            groups.append([name.strip().removesuffix(".py").removesuffix("/") for name in found.group(1).split(",")])
    return groups


@pytest.mark.parametrize("face", ["numpy", "torch"])
def test_a_face_imports_only_the_modules_drawn_above_each_one(face):
    """src/mha/README.md draws each face from its ground floor up: a module builds on those above it."""
    groups = face_order(face)
    rank = {name: i for i, group in enumerate(groups) for name in group}
    rooms = sorted({m.split(".")[2] for m in MODULES if m.startswith(f"mha.{face}.")})
    assert sorted(rank) == rooms, f"src/mha/README.md's map of {face}/ names {sorted(rank)}; the face has {rooms}"
    for module, imports in modules_imported_by(f"mha.{face}").items():
        if module == f"mha.{face}":
            continue
        mine = module.split(".")[2]
        above = {i.split(".")[2] for i in imports if i.startswith(f"mha.{face}.")} - {mine}
        below = sorted(r for r in above if r in rank and rank[r] > rank[mine])
        assert not below, f"{module} imports {below}, drawn below it in src/mha/README.md"


def test_the_faces_never_import_each_other():
    for face, other in (("numpy", "torch"), ("torch", "numpy")):
        for module, imports in modules_imported_by(f"mha.{face}").items():
            assert not {i for i in imports if i.startswith(f"mha.{other}")}, f"{module} imports the {other} face"


def test_the_texts_corpus_tokenizer_and_baselines_import_neither_face():
    for name in ("corpus", "tokenizer", "baselines"):
        imports = modules_imported_by(f"mha.text.{name}")[f"mha.text.{name}"]
        assert not {i for i in imports if i.startswith(("mha.numpy", "mha.torch"))}, (name, imports)


def test_the_experiments_stay_off_the_checks():
    for module, imports in modules_imported_by("mha.experiments").items():
        assert not {i for i in imports if i.startswith("mha.checks")}, module


def test_the_tools_import_the_library_only_through_its_public_names():
    """No private name (a leading underscore) and no chapter's checks module (mha.checks.chNN)."""
    for path in python_files("tools"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mha"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("mha")]
            else:
                continue
            for name in names:
                private = [part for part in name.split(".") if part.startswith("_")]
                chapter = re.fullmatch(r"mha\.checks\.ch\d\d(\..*)?", name)
                assert not private and not chapter, f"{path.relative_to(REPOSITORY)}:{node.lineno} imports {name}"


def test_every_tools_package_has_a_map_naming_all_its_modules():
    packages = [p.parent for p in (REPOSITORY / "tools").rglob("__init__.py") if "__pycache__" not in p.parts]
    assert packages, "tools/ has no packages"
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        modules = sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")
        subpackages = sorted(p.parent.name + "/" for p in package.glob("*/__init__.py"))
        words = set(re.findall(r"\w+", doc))  # `name.py` or `name`, `package/` or `package`
        unnamed = [m for m in modules + subpackages if m.removesuffix("/").removesuffix(".py") not in words]
        assert not unnamed, f"{package.relative_to(REPOSITORY)}/__init__.py's map does not name {unnamed}"


def test_no_test_file_edits_sys_path_or_imports_another_test_file():
    """Shared helpers live in the suite's helper modules; the repository root is on pytest's pythonpath."""
    for path in python_files("tests"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                parent_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                and n.func.value is node and n.func.attr in ("insert", "append", "extend")]
                assert not parent_calls, f"{path.relative_to(REPOSITORY)}:{node.lineno} edits sys.path"
            if isinstance(node, ast.Assign) and any("sys.path" in ast.unparse(t) for t in node.targets):
                pytest.fail(f"{path.relative_to(REPOSITORY)}:{node.lineno} assigns sys.path")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                tests = [n for n in names if n.split(".")[-1].startswith("test_") or n.startswith("tests.test_")]
                assert not tests, f"{path.relative_to(REPOSITORY)}:{node.lineno} imports the test file {tests}"
