"""Chapter 14, a model that writes: the checks of the exercises on the run around the model, `merge_pair` (one BPE
merge step), `warmup_cosine` (the learning rate of a step) and `clip_grad_norm` (gradients clipped by their global
norm), with their cases and their catalogued mistakes. (The sampling filters and bits per character: ch14.py.)

Every case of warmup_cosine sets final above 0 but the one that leaves it out, so that a cosine down to 0 shows;
its learning rates are about 1e-3, 1e6 times the comparison's absolute tolerance. The cases of clip_grad_norm that
must show the 1e-6 beside the norm are float64, with a norm of about 1e-5.
"""

import math

import numpy as np

from mha.checks.compare import ListOf
from mha.checks.inputs import normal
from mha.checks.registry import Case, cases_for, make_check, mistake, random_cases_for
from mha.checks.routes import TRAINING_FORBIDS

# merge_pair: one merge step of byte-pair encoding ----------------------------------------------------------


@cases_for("merge_pair", may_use="Python lists", forbids=TRAINING_FORBIDS)
def merge_pair_cases(r):
    """Overlapping pairs, chained pairs, the pair at either end, the pair reversed, no occurrence, a sequence of 0
    and of 1 id."""
    a, b, c = (int(i) for i in r.choice(256, size=3, replace=False))  # three distinct byte ids
    new = 256 + int(r.integers(0, 200))  # the merged token: an id after the 256 bytes
    return [
        Case("one occurrence in the middle: (c, a, b, c) with the pair (a, b)", ([c, a, b, c], (a, b), new)),
        Case("overlapping: (a, a, a) with the pair (a, a) gives (new, a), read from the left",
             ([a, a, a], (a, a), new)),
        Case("four in a row: (a, a, a, a) with the pair (a, a) gives (new, new)", ([a, a, a, a], (a, a), new)),
        Case("chained: (a, b, a, b, a) with the pair (b, a)", ([a, b, a, b, a], (b, a), new)),
        Case("the pair at the end: (c, c, a, b)", ([c, c, a, b], (a, b), new)),
        Case("the pair at the start and at the end: (a, b, c, a, b)", ([a, b, c, a, b], (a, b), new)),
        Case("the pair reversed only: (b, a) is not the pair (a, b)", ([c, b, a, c, b, a], (a, b), new)),
        Case("no occurrence: the two ids apart, (a, c, b)", ([a, c, b, a], (a, b), new)),
        Case("an empty sequence", ([], (a, b), new)),
        Case("one id, the pair's first", ([a], (a, b), new)),
    ]


@random_cases_for("merge_pair")
def merge_pair_random_cases(r):
    """Sequences of 2 to 30 ids over 3 symbols (pairs overlap often), the pair drawn from the sequence or not."""
    symbols = [int(i) for i in r.choice(256, size=3, replace=False)]
    cases = []
    for label in ("random: a pair of the sequence", "random: a pair of the sequence, one repeated id",
                  "random: any pair"):
        ids = [int(i) for i in r.choice(symbols, size=int(r.integers(2, 31)))]
        start = int(r.integers(len(ids) - 1))
        pair = {"random: a pair of the sequence": (ids[start], ids[start + 1]),
                "random: a pair of the sequence, one repeated id": (ids[start], ids[start]),
                "random: any pair": tuple(int(i) for i in r.choice(symbols, size=2))}[label]
        cases.append(Case(label, (ids, pair, 256 + int(r.integers(0, 1000)))))
    return cases


def merged_left_to_right(ids, pair, new_id, step=2):
    """The merge read from the left, moving on by `step` ids after a merge (2 is right)."""
    merged, i = [], 0
    while i < len(ids):
        if tuple(ids[i:i + 2]) == tuple(pair):
            merged.append(new_id)
            i += step
        else:
            merged.append(ids[i])
            i += 1
    return merged


@mistake("merge_pair", "read the sequence from the left: in (a, a, a) the first two ids merge and the third stays, "
         "(new, a); a merge from the right gives (a, new)")
def merge_from_the_right(ids, pair, new_id):
    return merged_left_to_right(ids[::-1], pair[::-1], new_id)[::-1]


@mistake("merge_pair", "both ids of a merged pair become the one new id: after a merge, skip the second id too "
         "(move on by 2), or it stays in the sequence and may merge again")
def merge_without_skipping(ids, pair, new_id):
    return merged_left_to_right(ids, pair, new_id, step=1)


@mistake("merge_pair", "keep the last id when it does not end a merged pair: a loop over the pairs (i, i + 1) "
         "stops one id short of the end")
def merge_drops_the_last_id(ids, pair, new_id):
    merged, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == tuple(pair):
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


@mistake("merge_pair", "replace every occurrence of the pair, not only the first")
def merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == tuple(pair):
            return list(ids[:i]) + [new_id] + list(ids[i + 2:])
    return list(ids)


@mistake("merge_pair", "the pair is ordered: (b, a) is not the pair (a, b), and stays as it is")
def merge_either_order(ids, pair, new_id):
    merged, i = [], 0
    while i < len(ids):
        if tuple(ids[i:i + 2]) in (tuple(pair), tuple(pair[::-1])):
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


check_merge_pair = make_check("merge_pair")

# warmup_cosine: the learning rate of a step ----------------------------------------------------------------


def schedule(r, warmup=None):
    """peak, warmup_steps, total_steps and final (5 to 20% of the peak) of a run; total - warmup even."""
    peak = float(r.uniform(1e-3, 1e-2))
    warmup = int(r.integers(5, 40)) if warmup is None else warmup
    return dict(peak=peak, warmup_steps=warmup, total_steps=warmup + 2 * int(r.integers(50, 200)),
                final=peak * float(r.uniform(0.05, 0.2)))


@cases_for("warmup_cosine", may_use="Python arithmetic (math.cos, math.pi)", forbids=TRAINING_FORBIDS)
def warmup_cosine_cases(r):
    """Step 0, the first and last warm-up steps, half-way down the cosine, its first step, the end, beyond it, no
    warm-up, final left out, and NumPy integers."""
    run = schedule(r)
    warmup, total = run["warmup_steps"], run["total_steps"]
    no_warmup = schedule(r, warmup=0)
    no_final = {k: v for k, v in schedule(r).items() if k != "final"}
    return [
        Case("step 0, before the first update", (0,), run),
        Case("the first warm-up step, step 1", (1,), run),
        Case("the last warm-up step, step = warmup_steps: the peak", (warmup,), run),
        Case("half-way down the cosine: (peak + final) / 2", ((warmup + total) // 2,), run),
        Case("the first cosine step, warmup_steps + 1: just below the peak", (warmup + 1,), run),
        Case("the last step, step = total_steps: final", (total,), run),
        Case("3 steps beyond the end: still final", (total + 3,), run),
        Case("long after the end: still final", (2 * total,), run),
        Case("warmup_steps = 0, step 0: the cosine starts at the peak", (0,), no_warmup),
        Case("warmup_steps = 0, a step of the cosine", (no_warmup["total_steps"] // 3,), no_warmup),
        Case("final left out (0 by default), a step of the cosine", (no_final["warmup_steps"] + 7,), no_final),
        Case("NumPy integers: np.int64 step and steps",
             (np.int64(warmup + 11),), {**run, "warmup_steps": np.int64(warmup), "total_steps": np.int64(total)}),
    ]


@random_cases_for("warmup_cosine")
def warmup_cosine_random_cases(r):
    """A step of the warm-up, one of the cosine, and any step up to 50 beyond the end of a run with or without a
    warm-up."""
    run = schedule(r, warmup=int(r.choice([0, int(r.integers(1, 60))])))
    warmup, total = run["warmup_steps"], run["total_steps"]
    return [
        Case("random: a warm-up step", (int(r.integers(0, warmup + 1)),), run),
        Case("random: a cosine step", (int(r.integers(warmup + 1, total + 1)),), run),
        Case("random: any step", (int(r.integers(0, total + 51)),), run),
    ]


def cosine_rate(step, peak, warmup_steps, total_steps, final, progress=None, turn=math.pi, clamp=True):
    """The rate with the usual warm-up and a cosine whose progress, turn and clamp a mistake may change."""
    if warmup_steps > 0 and step <= warmup_steps:
        return peak * step / warmup_steps
    if progress is None:
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(1.0, progress) if clamp else progress
    return final + (peak - final) * 0.5 * (1 + math.cos(turn * progress))


@mistake("warmup_cosine", "steps count from 1, and step 0 comes before the first update: the rate is 0 at step 0 "
         "and reaches the peak at step warmup_steps itself, not one step earlier")
def warmup_counted_from_zero(step, *, peak, warmup_steps, total_steps, final=0.0):
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return cosine_rate(step, peak, warmup_steps, total_steps, final)


@mistake("warmup_cosine", "the cosine starts at the peak at step warmup_steps: its progress is the steps after "
         "the warm-up over the steps of the decay, so the first step after the warm-up is already below the peak")
def cosine_one_step_late(step, *, peak, warmup_steps, total_steps, final=0.0):
    progress = (step - warmup_steps - 1) / max(1, total_steps - warmup_steps)
    return cosine_rate(step, peak, warmup_steps, total_steps, final, progress=max(0.0, progress))


@mistake("warmup_cosine", "the cosine begins where the warm-up ends: count its progress from step warmup_steps "
         "over total_steps - warmup_steps steps, not from step 0 over total_steps")
def cosine_over_the_whole_run(step, *, peak, warmup_steps, total_steps, final=0.0):
    return cosine_rate(step, peak, warmup_steps, total_steps, final, progress=step / total_steps)


@mistake("warmup_cosine", "half a cosine: the angle goes from 0 to pi over the decay, so the rate falls from the "
         "peak to final; an angle up to 2 pi brings it back up to the peak at the end")
def cosine_full_period(step, *, peak, warmup_steps, total_steps, final=0.0):
    return cosine_rate(step, peak, warmup_steps, total_steps, final, turn=2 * math.pi)


@mistake("warmup_cosine", "math.cos takes radians: half a turn is math.pi, not 180 (degrees)")
def cosine_in_degrees(step, *, peak, warmup_steps, total_steps, final=0.0):
    return cosine_rate(step, peak, warmup_steps, total_steps, final, turn=180)


@mistake("warmup_cosine", "the cosine goes down to `final`, not to 0: at step total_steps the rate is final")
def cosine_to_zero(step, *, peak, warmup_steps, total_steps, final=0.0):
    return cosine_rate(step, peak, warmup_steps, total_steps, 0.0)


@mistake("warmup_cosine", "`final` is the last learning rate itself, not a fraction of the peak")
def final_as_a_ratio(step, *, peak, warmup_steps, total_steps, final=0.0):
    return cosine_rate(step, peak, warmup_steps, total_steps, final * peak)


@mistake("warmup_cosine", "after total_steps the rate stays at final: the progress stops at 1, or the cosine "
         "climbs back up")
def cosine_beyond_the_end(step, *, peak, warmup_steps, total_steps, final=0.0):
    return cosine_rate(step, peak, warmup_steps, total_steps, final, clamp=False)


@mistake("warmup_cosine", "the decay follows half a cosine, (1 + cos(angle)) / 2 of the way from final to the peak, "
         "not a straight line")
def linear_decay(step, *, peak, warmup_steps, total_steps, final=0.0):
    if warmup_steps > 0 and step <= warmup_steps:
        return peak * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak - (peak - final) * progress


check_warmup_cosine = make_check("warmup_cosine")

# clip_grad_norm: gradients clipped by their global norm ----------------------------------------------------

EPS = 1e-6  # beside the norm, as torch.nn.utils.clip_grad_norm_ adds it


def gradients(r, shapes, norms, dtype=np.float64):
    """Arrays of the given shapes, each of the given norm (exactly, up to rounding)."""
    arrays = []
    for shape, norm in zip(shapes, norms):
        g = normal(r, shape)
        arrays.append(np.asarray(g * (norm / max(np.sqrt(np.sum(g * g)), 1e-300)), dtype=dtype))  # of length `norm`
    return arrays


@cases_for("clip_grad_norm", returns=(ListOf("gradient"), "total_norm"), may_use="NumPy",
           forbids=TRAINING_FORBIDS, fresh=True)  # "a list of new arrays"
def clip_grad_norm_cases(r):
    """One array, several below max_norm alone but above it together, small gradients, zeros, a tiny max_norm,
    float32, a parameter of shape (), an empty list, an integer max_norm."""
    return [
        Case("one (4, 3) array of norm 5, max_norm 1", (gradients(r, [(4, 3)], [5.0]), 1.0)),
        Case("three arrays, each of norm 0.9 (below max_norm = 1), together of norm 1.56",
             (gradients(r, [(3, 4), (4,), (2, 2, 3)], [0.9] * 3), 1.0)),
        Case("three arrays of norms 4, 2 and 0.5, max_norm 1: one scale for all",
             (gradients(r, [(5, 3), (3,), (3, 5)], [4.0, 2.0, 0.5]), 1.0)),
        Case("small gradients, norm 0.3 below max_norm 1: left as they are",
             (gradients(r, [(4, 4), (4,)], [0.2, math.sqrt(0.3 ** 2 - 0.2 ** 2)]), 1.0)),
        Case("all gradients zero: left as they are, total norm 0", ([np.zeros((3, 2)), np.zeros(2)], 1.0)),
        Case("a tiny max_norm, 1e-5, and a norm of 2e-5: the 1e-6 beside the norm matters",
             (gradients(r, [(3, 4), (4,)], [1.6e-5, 1.2e-5]), 1e-5)),
        Case("float32 gradients of norm 10, max_norm 2",
             (gradients(r, [(3, 4), (4,)], [8.0, 6.0], np.float32), 2.0)),
        Case("a parameter of shape () beside a matrix", (gradients(r, [(), (2, 3)], [3.0, 4.0]), 2.5)),
        Case("no gradients at all: an empty list", ([], 1.0)),
        Case("an integer max_norm, 1", (gradients(r, [(2, 5)], [3.0]), 1)),
    ]


@random_cases_for("clip_grad_norm")
def clip_grad_norm_random_cases(r):
    """1 to 4 arrays of random shapes (shape () too, and one of 4 dimensions) with norms from 0.05 to 5, in float64
    and float32."""
    def drawn(dtype):
        n = int(r.integers(1, 5))
        shapes = [tuple(int(s) for s in r.integers(1, 4, size=int(r.integers(0, 4)))) for _ in range(n - 1)]
        shapes.insert(int(r.integers(n)), tuple(int(s) for s in r.integers(1, 4, size=4)))  # a 4-D array
        return gradients(r, shapes, r.uniform(0.05, 5.0, size=n), dtype)
    return [
        Case("random: float64 gradients", (drawn(np.float64), float(r.choice([0.5, 1.0, 2.0, 5.0])))),
        Case("random: float32 gradients", (drawn(np.float32), float(r.choice([0.5, 1.0, 2.0, 5.0])))),
        Case("random: gradients below max_norm", (drawn(np.float64), 25.0)),
    ]


def global_norm(grads):
    return math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads))


def scaled(grads, scale):
    return [g * scale for g in grads]


@mistake("clip_grad_norm", "one norm for all the gradients together, as one long vector, and one scale for every "
         "array: clipping each array by its own norm changes the direction of the step")
def clipped_array_by_array(grads, max_norm):
    clipped = [g * min(1.0, max_norm / (global_norm([g]) + EPS)) for g in grads]
    return clipped, global_norm(grads)


@mistake("clip_grad_norm", "clip only: when the norm is below max_norm the gradients stay as they are; "
         "max_norm / norm above 1 would scale small gradients up")
def clipped_and_scaled_up(grads, max_norm):
    return scaled(grads, max_norm / (global_norm(grads) + EPS)), global_norm(grads)


@mistake("clip_grad_norm", "add 1e-6 to the norm before dividing, max_norm / (total_norm + 1e-6), as "
         "torch.nn.utils.clip_grad_norm_ does: with a norm near 1e-5 it matters")
def clipped_without_eps(grads, max_norm):
    total = global_norm(grads)
    return (scaled(grads, max_norm / total) if total > max_norm else [g.copy() for g in grads]), total


@mistake("clip_grad_norm", "the global norm is the square root of the sum of the squares of every entry, not the "
         "sum of the arrays' norms")
def norms_added(grads, max_norm):
    total = sum(global_norm([g]) for g in grads)
    return scaled(grads, min(1.0, max_norm / (total + EPS))), total


@mistake("clip_grad_norm", "the norm is the square root of the sum of the squares: the sum of the squares alone is "
         "its square")
def norm_squared(grads, max_norm):
    total = global_norm(grads) ** 2
    return scaled(grads, min(1.0, max_norm / (total + EPS))), total


@mistake("clip_grad_norm", "return the norm of the gradients as they came, before clipping (as torch does), not "
         "the norm after clipping")
def norm_after_clipping(grads, max_norm):
    clipped = scaled(grads, min(1.0, max_norm / (global_norm(grads) + EPS)))
    return clipped, global_norm(clipped)


check_clip_grad_norm = make_check("clip_grad_norm")
