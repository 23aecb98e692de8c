"""Chapter 17, attention that remembers less, what it chooses: the checks of `select_top_k_keys` (DeepSeek's sparse
attention keeps each query's k best keys) and `route_tokens` (a mixture of experts' router), their cases and their
catalogued mistakes. (The chapter's other checks are in `mha.checks.ch17`.)

The choices (top-k keys, experts) are exact: the cases hold exact ties or scores at least 1e-3 apart, so that no
rounding decides a choice; the first named case of each holds ties, and experts whose order by score is not their
order by index.
"""

import numpy as np

from mha.checks.inputs import batch, causal, normal, sizes
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.ch17 import stable_softmax
from mha.checks.routes import ROUTER_FORBIDS, TOP_K_KEYS_FORBIDS

# select_top_k_keys: each query's k best keys among the allowed ones ---------------------------------------------


TIED_KEYS = np.array([[3.0, 1.0, 3.0, 3.0, 0.0, 2.0],  # k = 2: keys 0 and 2
                      [5.0, 4.0, 4.0, 1.0, 0.0, -1.0],  # keys 0 and 1
                      [0.5, 2.0, -1.0, 2.0, 1.5, 0.0],  # keys 1 and 3
                      [1.0, 0.0, 1.0, 0.0, 1.0, 1.0],  # keys 0 and 2
                      [0.0, -2.0, 1.0, 1.0, 1.0, 2.0]])  # keys 5 and 2 (x86's vectorised default sort: 5 and 3)
TIED_LOGITS = np.array([[0.0, 1.0, -1.0, 1.0, 1.0, 2.0],  # top 3: experts 5, 1, 3
                        [-1.0, -1.0, -1.0, 1.0, 1.0, -1.0],  # experts 3, 4, 0
                        [2.0, 0.0, 2.0, 1.0, 0.0, 1.0],  # experts 0, 2, 3
                        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # experts 0, 1, 2
                        [1.0, 3.0, 1.0, 2.0, 2.0, 1.0]])  # experts 1, 3, 4


def default_sort_reorders_ties():
    """Whether NumPy's default argsort (not stable: vectorised on x86) chooses otherwise than a stable one among the
    ties of the named cases, here. Where it does, a solution that relies on it is wrong and gets its own hint; where it
    does not (a machine without those sorts), such a solution is right here, and no mistake stands for it."""
    return all(not np.array_equal(np.argsort(-rows, axis=-1)[:, :k], np.argsort(-rows, axis=-1, kind="stable")[:, :k])
               for rows, k in ((TIED_KEYS, 2), (TIED_LOGITS, 3)))


DEFAULT_SORT_REORDERS_TIES = default_sort_reorders_ties()


def tied_scores(r):
    """(5, 6) rows with ties at the k = 2nd score (the earlier keys win), moved and stretched by the seed (which
    changes no comparison)."""
    return TIED_KEYS * r.uniform(0.5, 2.0) + r.uniform(-3.0, 3.0)


def masked_keys_first(r, lead, T_q, T_k):
    """scores (*lead, T_q, T_k) whose largest scores sit on the keys that a mask of keys (*lead[:-1], 1, 1, T_k)
    blocks (about a third of them), and that mask."""
    scores = normal(r, lead + (T_q, T_k))
    blocked = np.zeros(lead[:-1] + (1, 1, T_k), dtype=bool)
    blocked[..., r.permutation(T_k)[:T_k // 3 + 1]] = True
    return np.where(blocked, scores + 10.0, scores), ~blocked


@cases_for("select_top_k_keys", forbids=TOP_K_KEYS_FORBIDS,
           may_use="NumPy: np.argsort, np.sort or np.argpartition (not mnp.top_k_filter or mnp.route_tokens)")
def select_top_k_keys_cases(r):
    """Ties first, a causal mask (fewer allowed keys than k), a mask of keys over the best scores, a fully masked
    row, k above T_k, k = 1, T_q != T_k, float32."""
    few = causal(5)
    few[3] = False  # query 3 may attend to nothing
    blocked_best, keys = masked_keys_first(r, (2, 3), 4, 7)
    return [
        Case("ties at the k-th score, k = 2: the earlier keys win", (tied_scores(r), 2)),
        Case("a causal mask (5, 5) over a batch (2, 5, 5), k = 3: queries 0 and 1 have fewer than 3 allowed keys",
             (normal(r, (2, 5, 5)), 3), {"mask": causal(5)}),
        Case("a mask of keys (2, 1, 1, 7) blocking the highest scores, scores (2, 3, 4, 7), k = 2",
             (blocked_best, 2), {"mask": keys}),
        Case("a query with no allowed key selects none, k = 2", (normal(r, (5, 5)), 2), {"mask": few}),
        Case("k = 9 above T_k = 6: every allowed key", (normal(r, (3, 6)), 9), {"mask": r.random((3, 6)) < 0.6}),
        Case("k = 1: the best key alone", (normal(r, (2, 4, 5)), 1)),
        Case("T_q = 3 queries, T_k = 8 keys, k = 3", (normal(r, (3, 8)), 3)),
        Case("float32 scores, k = 4", (normal(r, (2, 3, 6), np.float32), 4)),
    ]


@random_cases_for("select_top_k_keys")
def select_top_k_keys_random_cases(r):
    """Whole-number scores (ties) in a 4-D batch with a random mask, and float32 with a causal mask; k from 1 to
    T_k + 1."""
    T_q, T_k = sizes(r, 2, 2, 8)
    lead = batch(r, 2)
    return [
        Case("random: a 4-D batch of whole-number scores (ties), a random mask",
             (np.round(normal(r, lead + (T_q, T_k), scale=2)), int(r.integers(1, T_k + 2))),
             {"mask": r.random(lead[:1] + (1, T_q, T_k)) < 0.7}),
        Case("random: float32, a causal mask", (normal(r, lead + (T_k, T_k), np.float32), int(r.integers(1, T_k))),
             {"mask": causal(T_k)}),
    ]


def chosen(order, k, shape, axis=-1):
    """A boolean array of `shape`, True at the first k indices of `order` along `axis`."""
    keep = np.zeros(shape, dtype=bool)
    taken = np.take(order, np.arange(min(k, order.shape[axis])), axis=axis)
    np.put_along_axis(keep, taken, True, axis=axis)
    return keep


def allowed_of(scores, mask):
    return np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)


def best_first(scores, mask, k, fill=-np.inf):
    """Right but where fewer than k keys are allowed: the k best of the scores with `fill` on the masked keys."""
    filled = np.where(allowed_of(scores, mask), scores, fill)
    return chosen(np.argsort(-filled, axis=-1, kind="stable"), k, scores.shape)


@mistake("select_top_k_keys", "exactly k keys per row, and on a tie the earlier key: np.argsort(-scores, "
         "kind='stable')[..., :k] keeps k; comparing with the k-th score (>=) keeps every key tied with it")
def top_k_keys_all_ties(scores, k, mask=None):
    allowed = allowed_of(scores, mask)
    filled = np.where(allowed, scores, -np.inf)
    kth = -np.sort(-filled, axis=-1)[..., min(k, scores.shape[-1]) - 1:][..., :1]
    return allowed & (filled >= kth)


@mistake("select_top_k_keys", "on a tie the EARLIER key wins: np.argsort(scores)[..., -k:] sorts ascending, so among "
         "equal scores it keeps later keys; sort -scores with kind='stable' and take the first k")
def top_k_keys_later_ties(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, -np.inf)
    order = np.argsort(filled, axis=-1)[..., ::-1]  # as learners write it: the default sort
    return chosen(order, k, scores.shape) & allowed_of(scores, mask)


def top_k_keys_unstable(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, -np.inf)
    return chosen(np.argsort(-filled, axis=-1), k, scores.shape) & allowed_of(scores, mask)


if DEFAULT_SORT_REORDERS_TIES:
    mistake("select_top_k_keys", "on a tie the earlier key wins, and np.argsort's default sort is not stable (equal "
            "scores come out in any order): np.argsort(-scores, axis=-1, kind='stable')[..., :k]")(top_k_keys_unstable)


@mistake("select_top_k_keys", "select the k HIGHEST scores: np.argsort sorts in ascending order, so its first k "
         "are the lowest")
def top_k_keys_smallest(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, np.inf)
    return chosen(np.argsort(filled, axis=-1, kind="stable"), k, scores.shape) & allowed_of(scores, mask)


@mistake("select_top_k_keys", "a masked key is never selected (mask True = may attend): choose among the allowed "
         "keys only")
def top_k_keys_mask_ignored(scores, k, mask=None):
    return best_first(scores, None, k)


@mistake("select_top_k_keys", "where fewer than k keys are allowed, select those and no more: a masked key set to "
         "-inf (or -1e9) is still among the k largest of its row; keep `& mask` at the end")
def top_k_keys_masked_fill(scores, k, mask=None):
    return best_first(scores, mask, k)


@mistake("select_top_k_keys", "mask True means the key MAY be attended to (as everywhere in the course): choose "
         "among the True keys, not the False ones")
def top_k_keys_mask_flipped(scores, k, mask=None):
    flipped = None if mask is None else ~np.asarray(mask)
    return best_first(scores, flipped, k) & allowed_of(scores, flipped)


@mistake("select_top_k_keys", "each QUERY keeps its k best keys: sort along the last axis (the keys), not along "
         "the queries")
def top_k_keys_over_queries(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, -np.inf)
    return chosen(np.argsort(-filled, axis=-2, kind="stable"), k, scores.shape, axis=-2) & allowed_of(scores, mask)


@mistake("select_top_k_keys", "return a boolean array shaped like the scores, (..., T_q, T_k), True at the selected "
         "keys, not the indices of the keys")
def top_k_keys_indices(scores, k, mask=None):
    filled = np.where(allowed_of(scores, mask), scores, -np.inf)
    return np.argsort(-filled, axis=-1, kind="stable")[..., :k]


check_select_top_k_keys = make_check("select_top_k_keys")

# route_tokens: each token's top_k experts and their weights ---------------------------------------------------


def clear_choices(r, draw, top_k, gap=1e-3):
    """draw() -> (logits, bias, scoring), drawn again until the top_k + 1 largest choice scores of every token are
    at least `gap` apart (or exactly tied): no rounding can change the choice."""
    while True:
        logits, bias, scoring = draw()
        scores = 1 / (1 + np.exp(-logits.astype(np.float64))) if scoring == "sigmoid" else stable_softmax(
            logits.astype(np.float64))
        choice = -np.sort(-(scores + (0 if bias is None else bias)), axis=-1)[..., :top_k + 1]
        steps = -np.diff(choice, axis=-1)
        if np.all((steps == 0) | (steps >= gap)):
            return logits, bias


def router_case(label, r, lead, n_experts, top_k, scoring="softmax", normalize=False, bias=False, dtype=np.float64,
                scale=1.5, whole=False, offset=0.0):
    """A Case of route_tokens: logits (*lead, n_experts) (whole numbers: ties) plus `offset`, a bias of -0.3 .. 0.3
    if asked."""
    def draw():
        logits = normal(r, lead + (n_experts,), np.float64, scale)
        logits = (np.round(logits) if whole else logits).astype(dtype)
        return logits, (r.uniform(-0.3, 0.3, n_experts).astype(dtype) if bias else None), scoring
    logits, drawn_bias = clear_choices(r, draw, top_k)
    kwargs = {"scoring": scoring, "normalize": normalize} | ({"bias": drawn_bias} if bias else {})
    return Case(label, (logits + dtype(offset), top_k), kwargs)


def tied_logits(r):
    """(5, 6) whole-number logits with ties inside and at the edge of the top 3, stretched and moved by the seed (the
    scores keep the ties). The reversed ascending sort, and x86's vectorised default sort, choose otherwise in the
    first two rows."""
    return TIED_LOGITS * r.uniform(0.8, 1.5) + r.uniform(-2.0, 2.0)


def bias_that_turns_the_choice(r):
    """Sigmoid routing of 3 tokens over 5 experts where the bias changes the choice, and where it is added matters:
    in token 0, expert 1's logit 3 (score 0.95) loses to expert 3's logit 0 (score 0.5) with bias 0.6, where logits +
    bias would keep expert 1 (2.95 against 0.6); in token 1, expert 3 (logit 0.8) beats expert 0 (logit 1) on
    logits + bias too, so that adding the bias to the logits answers otherwise than leaving it out."""
    logits = np.array([[1.0, 3.0, -1.0, 0.0, -2.0], [1.0, 2.5, -0.5, 0.8, -1.0], [-1.0, 2.0, 0.1, -0.4, 0.8]])
    bias = np.array([0.0, -0.05, 0.1, 0.6, 0.05])
    shift = r.uniform(-0.1, 0.1, logits.shape)
    return (logits + shift, 2), {"scoring": "sigmoid", "normalize": True, "bias": bias + r.uniform(-0.01, 0.01, 5)}


@cases_for("route_tokens", returns=("weights", "experts"), forbids=ROUTER_FORBIDS, float32_promised=True,
           may_use="NumPy, nothing from mha")
def route_tokens_cases(r):
    """Softmax scores not normalised first, DeepSeek's sigmoid with a bias, normalised softmax scores, sigmoid alone,
    ties, logits near 1000, every expert, one expert, float32; last, an unknown scoring (ValueError)."""
    args, kwargs = bias_that_turns_the_choice(r)
    return [
        router_case("softmax scores, top_k = 2 of 6 experts, not normalised, a batch of tokens (2, 3, 6)",
                    r, (2, 3), 6, 2),
        Case("sigmoid scores and a bias that changes the choice (DeepSeek-V3), normalize=True", args, kwargs),
        router_case("softmax, normalize=True: the chosen scores divided by their sum, top_k = 3 of 5", r, (4,), 5, 3,
                    normalize=True),
        router_case("sigmoid scores, no bias, not normalised, top_k = 2 of 4", r, (3,), 4, 2, scoring="sigmoid"),
        Case("whole-number logits: tied experts go lower index first, top_k = 3 of 6", (tied_logits(r), 3)),
        router_case("logits of about 1000 (exp overflows without the maximum), softmax, top_k = 2", r, (2, 3), 6, 2,
                    offset=1000.0),
        router_case("top_k = 6 of 6 experts: all of them, best first", r, (2,), 6, 6, normalize=True),
        router_case("top_k = 1, normalize=True: a weight of 1", r, (3,), 4, 1, scoring="sigmoid", normalize=True,
                    bias=True),
        router_case("float32 logits and bias, sigmoid", r, (2, 2), 5, 2, scoring="sigmoid", bias=True,
                    dtype=np.float32),
        Case("scoring='relu': raise ValueError", (normal(r, (2, 4)), 2), {"scoring": "relu"}, raises=ValueError),
    ]


@random_cases_for("route_tokens")
def route_tokens_random_cases(r):
    """A 4-D batch with a random scoring, normalisation and bias; float32 whole-number logits (ties)."""
    n = int(r.integers(3, 9))
    lead = batch(r, 2) + (int(r.integers(1, 4)),)
    return [
        router_case("random: a 4-D batch", r, lead, n, int(r.integers(1, n + 1)),
                    scoring=str(r.choice(["softmax", "sigmoid"])), normalize=bool(r.integers(2)),
                    bias=bool(r.integers(2))),
        router_case("random: float32 whole-number logits (ties)", r, lead[1:], n, int(r.integers(1, n)),
                    normalize=bool(r.integers(2)), dtype=np.float32, whole=True),
    ]


def sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def routed(logits, top_k, scoring="softmax", normalize=False, bias=None, *, score=None, choose_by=None,
           order="best", weigh=None, divide_by=None):
    """route_tokens, right with the defaults; each keyword changes one step as a mistake does: score(logits) gives
    the scores, choose_by(scores, logits, bias) what the experts are chosen by, order how the choice is sorted
    ("best", "ascending", "index", "later ties", "unstable"), weigh(scores, choice) what the weights are taken from, and
    divide_by(weights, scores) what they are divided by."""
    scores = (score or (stable_softmax if scoring == "softmax" else sigmoid))(logits)
    b = 0 if bias is None else bias
    choice = choose_by(scores, logits, b) if choose_by else scores + b
    by_score = np.argsort(-choice, axis=-1, kind="stable")[..., :top_k]
    experts = {"best": by_score, "index": np.sort(by_score, axis=-1), "ascending": by_score[..., ::-1],
               "later ties": np.argsort(choice, axis=-1)[..., ::-1][..., :top_k],  # the default sorts, as learners
               "unstable": np.argsort(-choice, axis=-1)[..., :top_k]}[order]  # write them
    weights = np.take_along_axis(weigh(scores, choice) if weigh else scores, experts, axis=-1)
    if divide_by is not None:
        weights = weights / divide_by(weights, scores)
    elif normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights, experts


@mistake("route_tokens", "the bias moves the choice only: the weights are the chosen experts' scores WITHOUT the "
         "bias (DeepSeek-V3 balances the load with it, it changes no output)")
def router_bias_in_the_weights(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, weigh=lambda scores, choice: choice)


@mistake("route_tokens", "choose the experts by scores + bias: the bias is there to change the choice")
def router_bias_ignored(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, None)


@mistake("route_tokens", "add the bias to the SCORES (after the sigmoid), not to the logits: the choice is the top_k "
         "of sigmoid(logits) + bias")
def router_bias_on_the_logits(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, choose_by=lambda scores, lg, b: lg + b)


@mistake("route_tokens", "normalise after choosing: divide the chosen experts' scores by THEIR sum, not by the sum "
         "over all the experts")
def router_normalised_before_choosing(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    over_all = (lambda w, scores: scores.sum(axis=-1, keepdims=True)) if normalize else None
    return routed(logits, top_k, scoring, normalize, bias, divide_by=over_all)


@mistake("route_tokens", "with normalize=False the weights are the chosen scores as they are, softmax(logits) over "
         "ALL the experts taken at the chosen ones: divide by their sum only when normalize=True (a softmax over the "
         "chosen logits alone is that normalised form, gpt-oss's)")
def router_always_normalised(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, True, bias)


@mistake("route_tokens", "with normalize=True divide the chosen scores by their sum, so that a token's weights sum "
         "to 1")
def router_never_normalised(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, False, bias)


@mistake("route_tokens", "scoring='sigmoid' scores each expert on its own, 1 / (1 + exp(-logit)): not a softmax "
         "over the experts")
def router_always_softmax(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, "softmax", normalize, bias)


@mistake("route_tokens", "scoring='softmax' is a softmax over the experts (each token's scores sum to 1): not a "
         "sigmoid per expert")
def router_always_sigmoid(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, "sigmoid", normalize, bias)


@mistake("route_tokens", "order the chosen experts by their choice score, the best first: np.argsort(-choice) "
         "[..., :top_k], not the ascending order of np.argsort(choice)[..., -top_k:]")
def router_ascending(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, order="ascending")


@mistake("route_tokens", "order the chosen experts by their choice score, the best first, not by their index")
def router_in_index_order(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, order="index")


@mistake("route_tokens", "on a tie the LOWER index comes first: np.argsort(-choice, kind='stable'), not "
         "np.argsort(choice)[..., ::-1], which puts equal scores in another order")
def router_later_ties_first(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, order="later ties")


def router_unstable_sort(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias, order="unstable")


if DEFAULT_SORT_REORDERS_TIES:
    mistake("route_tokens", "on a tie the lower index comes first, and np.argsort's default sort is not stable (equal "
            "scores come out in any order): np.argsort(-choice, axis=-1, kind='stable')[..., :top_k]")(
        router_unstable_sort)


@mistake("route_tokens", "the softmax runs over each token's experts (the last axis), not over the tokens")
def router_softmax_over_tokens(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    return routed(logits, top_k, scoring, normalize, bias,
                  score=None if scoring != "softmax" else (lambda lg: stable_softmax(lg, axis=0)))


@mistake("route_tokens", "subtract each token's largest logit before exp: logits above 709 overflow to inf, and "
         "inf / inf is NaN")
def router_softmax_without_max(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
    def overflowing(lg):
        e = np.exp(lg)
        return e / e.sum(axis=-1, keepdims=True)
    return routed(logits, top_k, scoring, normalize, bias, score=None if scoring != "softmax" else overflowing)


check_route_tokens = make_check("route_tokens")
