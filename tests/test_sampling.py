"""Sampling, both faces: `filter_logits` against transformers' warpers, `generate` against
`generate(do_sample=True)` of a GPT-2, the NumPy sampler against its distribution, and bad input.

Logits are rounded so that ties fall on the top-k value and across the top-p cut. V = 50 is past
16, where torch.sort (which transformers' top-p uses, not stable) stops keeping tied ids in order."""

import numpy as np
import pytest
import torch
import transformers
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import mha.numpy as mnp
import mha.torch as mt

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is fastest

V = 64  # the GPT-2's vocabulary
OPTION_SETS = [dict(temperature=1.0, top_k=None, top_p=None), dict(temperature=0.7, top_k=5, top_p=None),
               dict(temperature=1.3, top_k=None, top_p=0.8), dict(temperature=1.0, top_k=12, top_p=0.6)]


def transformers_filter(logits, temperature, top_k, top_p):
    """The warpers that generate(do_sample=True) builds, applied in its order (it skips temperature
    1.0, top_k None or 0, top_p 1.0)."""
    warpers = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
    warpers += [TopKLogitsWarper(top_k)] if top_k else []
    warpers += [TopPLogitsWarper(top_p)] if top_p is not None and top_p < 1.0 else []
    for warper in warpers:
        logits = warper(None, logits)
    return logits


def rounded_logits(width, rows=64, seed=0, dtype=torch.float32):
    """Logits (rows, width) rounded to whole numbers: many ties."""
    generator = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(rows, width, generator=generator, dtype=torch.float64)).round().to(dtype)


FILTERS = [(t, k, p) for t in (0.6, 1.0, 2.0) for k in (None, 1, 3, "V", "V+3")
           for p in (None, 1e-9, 0.35, 0.8, 1.0)]


@pytest.mark.parametrize("width", [7, 50])
def test_filter_logits_equals_transformers_warpers(width):
    logits = rounded_logits(width)
    for temperature, top_k, top_p in FILTERS:
        k = {"V": width, "V+3": width + 3}.get(top_k, top_k)
        expected = transformers_filter(logits.clone(), temperature, k, top_p)
        got = mt.filter_logits(logits, temperature=temperature, top_k=k, top_p=top_p)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0, msg=f"t={temperature} k={k} p={top_p}")


def assert_same_up_to_tied_tokens_at_the_cut(numpy_result, torch_result):
    """Equal values kept in every row; where the two faces keep different tokens, every such token's
    logit equals the smallest kept one (a tie across the top-p cut, which torch's sort and NumPy's
    ranking by id break differently)."""
    a, b = numpy_result, torch_result.numpy()
    np.testing.assert_allclose(np.sort(a, -1), np.sort(b, -1), rtol=1e-12, atol=0)
    differs = np.isfinite(a) != np.isfinite(b)  # (rows, V)
    either = np.where(np.isfinite(a), a, b)  # (rows, V): the logit of a token kept by either face
    smallest_kept = np.where(np.isfinite(a), a, np.inf).min(-1, keepdims=True)  # (rows, 1)
    assert np.all((either == smallest_kept)[differs])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_filter_alone_equals_its_warper_in_both_faces(dtype):
    """apply_temperature, top_k_filter and top_p_filter (which, unlike generate, does not skip p = 1):
    mha.torch equal to transformers' warper, bit for bit; mha.numpy equal too, but for which tied
    tokens stay at the top-p cut."""
    small, large = rounded_logits(7, dtype=dtype), rounded_logits(50, dtype=dtype)
    filters = [("apply_temperature", TemperatureLogitsWarper, value, large) for value in (0.3, 1.0, 2.5)]
    filters += [("top_k_filter", TopKLogitsWarper, value, logits) for value in (1, 3, 7, 60)
                for logits in (small, large)]
    filters += [("top_p_filter", TopPLogitsWarper, value, logits) for value in (1e-9, 0.35, 0.8, 1.0)
                for logits in (small, large)]
    for name, warper, value, logits in filters:
        expected = warper(value)(None, logits.clone())
        got = getattr(mt, name)(logits, value)
        assert got.dtype == dtype and torch.equal(got, expected), (name, value)
        reference = getattr(mnp, name)(logits.numpy(), value)
        assert reference.dtype == logits.numpy().dtype, (name, value)
        if name == "top_p_filter":
            assert_same_up_to_tied_tokens_at_the_cut(reference, expected)
        else:
            np.testing.assert_array_equal(reference, expected.numpy(), err_msg=f"{name} {value}")


@pytest.mark.parametrize("face", [mt, mnp], ids=["torch", "numpy"])
def test_the_edge_cases_keep_what_they_promise(face):
    logits = rounded_logits(50, rows=200)  # float32
    n_top = (logits == logits.max(-1, keepdim=True).values).sum(-1).numpy()  # (rows,): ties at the top
    assert n_top.max() > 1  # the case worth checking is there
    as_input = (lambda x: x) if face is mt else (lambda x: x.numpy())
    kept = lambda **options: np.isfinite(np.asarray(face.filter_logits(as_input(logits), **options))).sum(-1)
    np.testing.assert_array_equal(kept(top_k=1), n_top)  # k = 1 keeps every token tied with the largest
    np.testing.assert_array_equal(kept(top_p=1e-9), 1)  # 1 - p rounds to 1 in float32: still one token stays
    np.testing.assert_array_equal(kept(top_p=1e-6), 1)
    for nothing_out in (dict(top_k=50), dict(top_k=500), dict(top_p=1.0), dict(temperature=0.3)):
        np.testing.assert_array_equal(kept(**nothing_out), 50)
    third = logits.sort(-1, descending=True).values[:, 2:3]  # (rows, 1)
    np.testing.assert_array_equal(kept(top_k=3), (logits >= third).sum(-1).numpy())  # ties at the k-th value stay


def test_an_exact_top_p_boundary_and_a_tie_across_it():
    """32 equal tokens hold 1/32 each (exact in binary): p = 1/2 drops the 16 whose mass adds up to
    exactly 1 - p. Which 16 is transformers' sort's choice; NumPy drops the smaller ids."""
    theirs = transformers_filter(torch.zeros(1, 32), 1.0, None, 0.5)[0]
    ours = mt.filter_logits(torch.zeros(32), top_p=0.5)
    assert torch.equal(ours, theirs) and int(ours.isfinite().sum()) == 16
    reference = mnp.filter_logits(np.zeros(32), top_p=0.5)
    np.testing.assert_array_equal(np.isfinite(reference), np.arange(32) >= 16)


@pytest.mark.parametrize("top_p", [0.35, 0.8])
def test_numpy_top_p_ranks_equal_logits_by_id(top_p):
    """The rule written pairwise: token i goes when the tokens ranked at or below it (smaller logit,
    or equal logit and id <= i) hold at most 1 - p, unless it is the top-ranked token."""
    z = rounded_logits(50, dtype=torch.float64).numpy()  # (rows, V)
    probs = np.exp(z - z.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)  # (rows, V)
    i, j = np.arange(50)[:, None], np.arange(50)[None, :]
    at_or_below = (z[:, None, :] < z[:, :, None]) | ((z[:, None, :] == z[:, :, None]) & (j <= i))  # (rows, i, j)
    mass = (at_or_below * probs[:, None, :]).sum(-1)  # (rows, V)
    drop = mass <= 1 - top_p
    top = 49 - np.argmax(z[:, ::-1], axis=-1)  # the largest logit, the largest id among ties
    drop[np.arange(len(z)), top] = False
    np.testing.assert_array_equal(np.isinf(mnp.filter_logits(z, top_p=top_p)), drop)


def test_filter_logits_keeps_the_shape_and_dtype_of_any_batch():
    logits = rounded_logits(50, rows=6, dtype=torch.float64).reshape(2, 3, 50)
    got = mt.filter_logits(logits, temperature=0.5, top_k=9, top_p=0.7)
    expected = transformers_filter(logits.reshape(6, 50), 0.5, 9, 0.7).reshape(2, 3, 50)  # (2, 3, V)
    assert got.dtype == torch.float64 and torch.equal(got, expected)
    one = mnp.filter_logits(np.zeros(5, dtype=np.float32), temperature=0.5)
    assert one.dtype == np.float32 and one.shape == (5,)


@pytest.mark.parametrize("width", [7, 50])
def test_the_numpy_twin_equals_the_torch_face(width):
    rounded = rounded_logits(width, dtype=torch.float64)
    smooth = torch.randn(64, width, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    differing_rows = 0
    for temperature, top_k, top_p in FILTERS:
        options = dict(temperature=temperature, top_k={"V": width, "V+3": width + 3}.get(top_k, top_k), top_p=top_p)
        ours = mnp.filter_logits(rounded.numpy(), **options)
        theirs = mt.filter_logits(rounded, **options)
        assert_same_up_to_tied_tokens_at_the_cut(ours, theirs)
        differing_rows += (np.isfinite(ours) != np.isfinite(theirs.numpy())).any(-1).sum()
        if top_p is None or top_p == 1.0:  # no top-p cut: no tie to break, the same tokens
            np.testing.assert_array_equal(np.isinf(ours), theirs.isinf().numpy())
        # without ties, exactly the same tokens
        np.testing.assert_allclose(mnp.filter_logits(smooth.numpy(), **options),
                                   mt.filter_logits(smooth, **options).numpy(), rtol=1e-12, atol=0)
    if width > 16:
        assert differing_rows > 0  # ties across the cut were really there, and broken differently


def tiny_gpt2(seed=0):
    """A random GPT-2 (weights N(0, 0.3)) with no end-of-sequence token, so nothing stops early."""
    config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=V, n_positions=64,
                                     bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


def sample_with_transformers(model, prompt, n_new, temperature, top_k, top_p):
    """generate(do_sample=True) with every sampling option explicit: top_k=None would keep its
    default of 50, so no top-k is top_k=0; no top-p is top_p=1.0."""
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_new, do_sample=True,
                          num_beams=1, temperature=temperature, top_k=top_k or 0,
                          top_p=1.0 if top_p is None else top_p, min_p=None, typical_p=1.0, epsilon_cutoff=0.0,
                          eta_cutoff=0.0, repetition_penalty=1.0, pad_token_id=0)


@pytest.fixture(scope="module")
def gpt2():
    """The GPT-2 and our copy, in float64: both sample from the float32 logits (transformers casts
    them), which then agree to the last bit, so no draw can tip on rounding."""
    model = tiny_gpt2().double()
    return model, mt.from_transformers(model)


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: "t={temperature} k={top_k} p={top_p}".format(**o))
def test_generate_writes_transformers_tokens_after_the_same_seed(gpt2, options):
    model, ours = gpt2
    for seed in range(5):
        prompt = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(100 + seed))  # (B, T_0)
        torch.manual_seed(seed)
        expected = sample_with_transformers(model, prompt, 12, **options)
        torch.manual_seed(seed)
        got = mt.generate(ours, prompt, 12, **options)
        assert torch.equal(got, expected), f"seed {seed}"
        assert len(set(got[:, 4:].flatten().tolist())) > 3  # sampled, not one token again and again


def test_one_sequence_is_a_batch_of_one(gpt2):
    model, ours = gpt2
    prompt = torch.tensor([5, 9, 2])
    for seed in range(2):
        torch.manual_seed(seed)
        expected = sample_with_transformers(model, prompt[None], 10, 0.9, 20, 0.9)[0]
        torch.manual_seed(seed)
        assert torch.equal(mt.generate(ours, prompt, 10, temperature=0.9, top_k=20, top_p=0.9), expected)


def test_a_generator_makes_the_draws_reproducible_on_their_own(gpt2):
    _, ours = gpt2
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    global_state = torch.get_rng_state()
    draw = lambda seed: mt.generate(ours, prompt, 16, generator=torch.Generator().manual_seed(seed))
    first, again, other = draw(7), draw(7), draw(8)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(torch.get_rng_state(), global_state)  # the global generator was not touched


def test_one_token_kept_is_greedy_generation_in_both_faces(gpt2):
    _, ours = gpt2
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    greedy = ours.generate(prompt, 10)
    assert torch.equal(mt.generate(ours, prompt, 10, top_k=1), greedy)
    assert torch.equal(mt.generate(ours, prompt, 10, top_p=1e-6), greedy)
    params = ours.numpy_params()
    logits_fn = lambda tokens: mnp.transformer_lm(tokens, **params)
    np_greedy = mnp.generate_greedy(logits_fn, prompt.numpy(), 10)
    np.testing.assert_array_equal(mnp.generate(logits_fn, prompt.numpy(), 10, top_k=1, rng=np.random.default_rng(0)),
                                  np_greedy)
    np.testing.assert_array_equal(np_greedy, greedy.numpy())


def test_a_transformer_lm_reads_the_prompt_once_then_one_token_per_step(gpt2):
    _, ours = gpt2
    seen = []

    class Spy:  # the model, recording the shape of every input it is given
        new_cache = ours.new_cache

        def __call__(self, tokens, **options):
            seen.append(tuple(tokens.shape))
            return ours(tokens, **options)

    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    written = mt.generate(Spy(), prompt, 4, generator=torch.Generator().manual_seed(0))
    assert seen == [(2, 3), (2, 1), (2, 1), (2, 1)]
    assert torch.equal(written, mt.generate(ours, prompt, 4, generator=torch.Generator().manual_seed(0)))


def test_a_model_without_a_cache_is_called_on_all_the_tokens():
    torch.manual_seed(0)
    model = mt.DecoderOnlyTransformer(V, 16, 2, 1, 32, max_len=32).eval()
    prompt = torch.tensor([[1, 2], [3, 4]])
    got = mt.generate(model, prompt, 6, generator=torch.Generator().manual_seed(0))
    assert got.shape == (2, 8) and torch.equal(got[:, :2], prompt)
    assert torch.equal(mt.generate(model, prompt, 6, top_k=1), mt.generate_greedy(model, prompt, 6))


def test_the_numpy_sampler_draws_from_the_filtered_distribution():
    """100 000 draws of one token: every frequency within 0.01 of its probability (6 standard
    deviations at most); each wrong sampler below is at least 0.03 away somewhere, so it would fail."""
    z = np.array([2.0, 1.5, 1.5, 0.3, 0.0, -0.5, -1.0, -3.0])
    options = dict(temperature=0.8, top_k=6, top_p=0.9)
    probs = torch.softmax(transformers_filter(torch.tensor(z)[None], 0.8, 6, 0.9), -1)[0].double().numpy()
    first_position = -z  # a sampler that read the wrong position would draw from this

    def logits_fn(tokens):  # (N, 2) -> (N, 2, V)
        return np.broadcast_to(np.stack([first_position, z]), (*tokens.shape, len(z)))

    prompt = np.zeros((100_000, 2), dtype=np.int64)
    tokens = mnp.generate(logits_fn, prompt, 1, rng=np.random.default_rng(0), **options)
    assert tokens.shape == (100_000, 3) and np.array_equal(tokens[:, :2], prompt)
    frequencies = np.bincount(tokens[:, -1], minlength=len(z)) / len(tokens)
    assert np.abs(frequencies - probs).max() < 0.01
    assert np.all(frequencies[probs == 0] == 0) and (probs == 0).sum() >= 3  # ruled out, never drawn
    softmax = lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    wrong = {"no filter": softmax(z / 0.8), "no temperature": softmax(mnp.filter_logits(z, top_k=6, top_p=0.9)),
             "ids shifted by one": np.roll(probs, 1), "the wrong position": softmax(first_position / 0.8)}
    for name, q in wrong.items():
        assert np.abs(q - probs).max() > 0.03, name


def test_numpy_generate_is_reproducible_with_its_rng():
    table = np.random.default_rng(0).standard_normal((V, V))  # a bigram model: the next token's logits
    logits_fn = lambda tokens: table[tokens]  # (..., T) -> (..., T, V)
    draw = lambda seed: mnp.generate(logits_fn, np.array([1, 2]), 20, temperature=1.2, rng=np.random.default_rng(seed))
    assert np.array_equal(draw(3), draw(3)) and not np.array_equal(draw(3), draw(4))
    assert draw(3).shape == (22,) and mnp.generate(logits_fn, np.array([1, 2]), 5).shape == (7,)  # rng=None


BAD_OPTIONS = [
    (dict(temperature=0.0), ValueError, "temperature must be a finite number > 0, got 0.0"),
    (dict(temperature=-1), ValueError, "got -1"),
    (dict(temperature=float("inf")), ValueError, "got inf"),
    (dict(temperature=True), ValueError, "got True"),
    (dict(top_k=0), ValueError, r"top_k must be None \(no filter\) or an integer >= 1, got top_k=0"),
    (dict(top_k=2.5), TypeError, "top_k must be None or an integer >= 1, got float 2.5"),
    (dict(top_p=0.0), ValueError, r"top_p must be None \(no filter\) or a number in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), ValueError, "got 1.5"),
    (dict(top_p=float("nan")), ValueError, "got nan"),
]


@pytest.mark.parametrize("options,error,message", BAD_OPTIONS, ids=lambda x: str(x) if isinstance(x, dict) else "")
def test_bad_options_are_named_in_both_faces(gpt2, options, error, message):
    _, ours = gpt2
    table = np.zeros((V, V))
    with pytest.raises(error, match=message):
        mt.filter_logits(torch.zeros(3, V), **options)
    with pytest.raises(error, match=message):
        mnp.filter_logits(np.zeros((3, V)), **options)
    with pytest.raises(error, match=message):
        mt.generate(ours, torch.tensor([1, 2]), 3, **options)
    with pytest.raises(error, match=message):
        mnp.generate(lambda t: table[t], np.array([1, 2]), 3, **options)


def test_bad_prompts_logits_and_generators_are_named(gpt2):
    _, ours = gpt2
    table = np.zeros((V, V))
    numpy_lm = lambda t: table[np.minimum(t, V - 1)]  # (..., T) -> (..., T, V), checking no id itself
    for face, model, as_ids in ((mt, ours, torch.tensor), (mnp, numpy_lm, np.array)):
        with pytest.raises(ValueError, match=f"prompt holds the id {V}, but the vocabulary has ids 0 .. {V - 1}"):
            face.generate(model, as_ids([1, V]), 2)
        with pytest.raises(ValueError, match="prompt holds the id -1"):
            face.generate(model, as_ids([1, -1]), 2)
        with pytest.raises(TypeError, match="prompt must be integer token ids, got dtype"):
            face.generate(model, as_ids([1.0, 2.0]), 2)
        with pytest.raises(ValueError, match=r"prompt must have 1 to 2 dimensions, got 3 \(shape \(1, 1, 2\)\)"):
            face.generate(model, as_ids([[[1, 2]]]), 2)
        with pytest.raises(ValueError, match="prompt must hold at least one token per sequence"):
            face.generate(model, as_ids([[]]).reshape(1, 0).astype(int) if face is mnp else
                          torch.zeros(1, 0, dtype=torch.long), 2)
        with pytest.raises(ValueError, match="n_new must be at least 0, got n_new=-1"):
            face.generate(model, as_ids([1, 2]), -1)
        with pytest.raises(TypeError, match="n_new must be an integer, got float 2.0"):
            face.generate(model, as_ids([1, 2]), 2.0)
    with pytest.raises(TypeError, match="generator must be None .* or a torch.Generator, got int"):
        mt.generate(ours, torch.tensor([1, 2]), 2, generator=0)
    with pytest.raises(TypeError, match=r"rng must be None or a numpy.random.Generator .*, got int"):
        mnp.generate(numpy_lm, np.array([1, 2]), 2, rng=0)
    with pytest.raises(ValueError, match=r"logits_fn must return logits of shape \(..., T, V\) = \(\*\(2,\), V\)"):
        mnp.generate(lambda t: np.zeros(V), np.array([1, 2]), 2)
    with pytest.raises(ValueError, match=r"model must return logits of shape \(B, T, V\)"):
        mt.generate(lambda t: torch.zeros(V), torch.tensor([1, 2]), 2)
    for face, logits in ((mt, torch.zeros(2, 5)), (mnp, np.zeros((2, 5)))):
        with pytest.raises(ValueError, match="k must be at least 1, got k=0"):
            face.top_k_filter(logits, 0)
        with pytest.raises(TypeError, match="k must be an integer, got NoneType None"):
            face.top_k_filter(logits, None)
        with pytest.raises(ValueError, match=r"p must be a number in \(0, 1\], got 0"):
            face.top_p_filter(logits, 0)
        with pytest.raises(ValueError, match="temperature must be a finite number > 0, got -2"):
            face.apply_temperature(logits, -2)
    with pytest.raises(TypeError, match="logits must be a floating-point tensor, got dtype torch.int64"):
        mt.filter_logits(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"logits must have shape \(..., V\) with V >= 1, got \(\)"):
        mt.filter_logits(torch.tensor(1.0))
    with pytest.raises(ValueError, match="logits must have at least 1 dimensions, got 0"):
        mnp.filter_logits(np.float64(1.0))
    with pytest.raises(TypeError, match="logits must be an array of numbers, got dtype bool"):
        mnp.filter_logits(np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="the probabilities to sample from are not finite"):
        mnp.generate(lambda t: np.full((*t.shape, V), np.nan), np.array([1, 2]), 1)
