"""Rotary position embeddings (RoPE), the PyTorch face of `mha.numpy.rotary`.

Hugging Face Llama's "rotate half" convention: frequency i turns the pair made of
feature i and feature i + d_head / 2 by the angle position * base^(-2i / d_head).
The tables follow the dtype asked for: float64 tables are computed in float64;
the others in float32, exactly as Llama's `LlamaRotaryEmbedding`, then cast.
"""

import math

import torch

from mha import rope_scaling, validate
from mha.torch.tensors import check_is_tensor, check_tensor


def check_even_width(name, d_head):
    """RoPE turns features in pairs, so a head's width must be even."""
    if d_head % 2:
        raise ValueError(f"{name} has width d_head={d_head}, but rotary embeddings turn features "
                         f"in pairs: d_head must be even")


def rotary_embedding(T, d_head, base=10000.0, offset=0, *, dtype=None, device=None, scaling=None):
    """The rotation tables (cos, sin), each (T, d_head), for positions offset .. offset + T - 1.

    Column i and column i + d_head / 2 hold the same angle, position * base^(-2i / d_head).
    `dtype` defaults to torch's default dtype. `scaling` (see `rotary_frequencies`) changes the
    frequencies, and YaRN also scales both tables; dynamic NTK reads the length offset + T.
    """
    T, d_head = validate.check_int("T", T), validate.check_int("d_head", d_head)
    offset = validate.check_int("offset", offset, minimum=0)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    inv_freq, attention_factor = rotary_frequencies(d_head, base, scaling, seq_len=offset + T, dtype=dtype,
                                                    device=device)  # (d/2,)
    angles = torch.arange(offset, offset + T, dtype=inv_freq.dtype, device=device)[:, None] * inv_freq  # (T, d/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, d_head): pair i and i + d/2 share an angle
    if attention_factor == 1.0:
        return angles.cos().to(dtype), angles.sin().to(dtype)
    return (angles.cos() * attention_factor).to(dtype), (angles.sin() * attention_factor).to(dtype)


def rotate_half(x):
    """(x1, x2) -> (-x2, x1), where x1 and x2 are the first and second halves of the last axis."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., d/2) each
    return torch.cat([-x2, x1], dim=-1)  # (..., d)


def apply_rotary(x, cos, sin):
    """x rotated by the tables of `rotary_embedding`: x * cos + rotate_half(x) * sin.

    x: (..., T, d_head); cos, sin: (T, d_head) (or anything that broadcasts to x).
    Returns x's shape and dtype; the tables are cast to x's dtype, as Llama does.
    """
    check_tensor("x", x)
    check_even_width("x", x.shape[-1])
    for name, table in (("cos", cos), ("sin", sin)):
        check_is_tensor(name, table)
        validate.check_ndim(name, table, 2)
        if tuple(table.shape[-2:]) != tuple(x.shape[-2:]):
            raise ValueError(f"{name} has shape {validate.shape_str(table.shape)} but x has shape "
                             f"{validate.shape_str(x.shape)}: the tables need one row per position "
                             f"(T={x.shape[-2]}) and one column per feature (d_head={x.shape[-1]})")
        if table.device != x.device:
            raise ValueError(f"{name} is on {table.device}, x on {x.device}: make the tables with device=x.device")
    return rotated(x, cos.to(x.dtype), sin.to(x.dtype))


def rotated(x, cos, sin):
    """`apply_rotary` without its checks, for tables that a caller made to fit x."""
    return x * cos + rotate_half(x) * sin


def rotated_by_signed_sin(x, cos, signed_sin):
    """x * cos + rotate_half(x) * sin in four kernels instead of five: rotate_half(x) * sin is
    roll(x) * signed_sin, the halves of x swapped by one roll (rotate_half's neg and cat), and
    its minus sign moved into the table (-sin on the first half), which changes no bit."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def rotary_frequencies(d_head, base=10000.0, scaling=None, *, seq_len=None, dtype=None, device=None):
    """(inv_freq, attention_factor): the d_head / 2 frequencies of RoPE, and the factor that
    scales cos and sin (1 except for YaRN), with a RoPE scaling applied if given.

    scaling: None, or a dict as transformers' rope_parameters (mha.rope_scaling): rope_type
    "linear", "dynamic", "yarn" or "llama3" with its keys. seq_len: the number of positions
    seen so far, which only dynamic NTK reads. float32 frequencies are computed with the same
    operations as transformers' ROPE_INIT_FUNCTIONS, and are equal to them bit for bit.
    """
    d_head = validate.check_int("d_head", d_head)
    check_even_width("the rotary table", d_head)
    base, scaling = validate.check_base(base), rope_scaling.check_rope_scaling(scaling)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32  # transformers: float32
    kind = "default" if scaling is None else scaling["rope_type"]
    if kind == "dynamic":
        seq_len = validate.check_int("seq_len", seq_len if seq_len is not None else 1)
        base = rope_scaling.dynamic_ntk_base(scaling, d_head, base, seq_len)
    exponents = torch.arange(0, d_head, 2, dtype=torch.int64, device=device).to(work) / d_head  # (d/2,)
    if kind == "yarn":
        return yarn_frequencies(scaling, d_head, base, exponents), rope_scaling.yarn_attention_factor(scaling)
    inv_freq = 1.0 / (base ** exponents)  # (d/2,)
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        inv_freq = llama3_frequencies(scaling, inv_freq)
    return inv_freq, 1.0


def yarn_frequencies(scaling, d_head, base, exponents):
    """YaRN: the original frequencies for the fast dimensions, divided by the factor for the slow
    ones, and a linear blend in between."""
    low, high = rope_scaling.yarn_ramp_range(scaling, d_head, base)
    powers = base ** exponents  # (d/2,)
    original, interpolated = 1.0 / powers, 1.0 / (scaling["factor"] * powers)
    ramp = (torch.arange(d_head // 2, dtype=exponents.dtype, device=exponents.device) - low) / (high - low)
    keep = 1 - ramp.clamp(0, 1)  # (d/2,): 1 = keep the original frequency
    return interpolated * (1 - keep) + original * keep


def llama3_frequencies(scaling, inv_freq):
    """Llama 3.1's: wavelengths beyond original / low_freq_factor divided by the factor, those below
    original / high_freq_factor kept, and a smooth blend between."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq  # (d/2,)
    scaled = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < context / high) * ~(wavelength > context / low)
    return torch.where(medium, blended, scaled)


class RotaryTables:
    """One layer's RoPE (d_head, base, scaling): its tables made once per device and dtype, for
    positions 0 .. L - 1 with L doubled when a longer sequence comes, then sliced at each call.

    Decoding asks for one position per step; slicing a stored table costs nothing, where
    building it costs a dozen small kernels. Integer `positions` on the CPU pick their rows from
    the tables too; elsewhere (reading the largest would make the CPU wait for the device) they
    are computed. Dynamic NTK's frequencies change with the length, so it builds the rows it is
    asked for, keyed on nothing. Equal, row for row, to `rotary_embedding`, whose operations it
    runs. `rotate(q, k, ...)` turns a layer's queries and keys, as `apply_rotary` does.
    """

    GATHERED_POSITIONS = 1 << 16  # positions beyond are computed, not stored

    def __init__(self, d_head, base=10000.0, scaling=None):
        self.d_head, self.base = validate.check_int("d_head", d_head), validate.check_base(base)
        check_even_width("the rotary table", self.d_head)
        self.scaling = rope_scaling.check_rope_scaling(scaling)
        self.dynamic = self.scaling is not None and self.scaling["rope_type"] == "dynamic"
        self.tables = {}  # (device, dtype) -> cos, signed sin (L, d_head), and the signs (d_head,)
        self.frequencies = {}  # (device, dtype) -> (inv_freq (d/2,), attention factor), for `at`

    def __call__(self, T, start=0, positions=None, dtype=torch.float32, device=None):
        """(cos, sin) for the new tokens: (T, d_head) for positions start .. start + T - 1, or
        (..., 1, T, d_head), one row per head to broadcast over, for integer `positions` (..., T)."""
        return self.rows(T, start, positions, dtype, device)

    def rotate(self, q, k, start=0, positions=None):
        """q (..., h, T, d_head) and k (..., h_kv, T, d_head) turned by their positions, start ..
        start + T - 1 or the integer `positions` (..., T): what apply_rotary(q, cos, sin) and
        apply_rotary(k, cos, sin) give with this layer's tables, in fewer kernels."""
        cos, signed_sin = self.rows(q.shape[-2], start, positions, q.dtype, q.device, signed=True)
        return rotated_by_signed_sin(q, cos, signed_sin), rotated_by_signed_sin(k, cos, signed_sin)

    def rows(self, T, start, positions, dtype, device, signed=False):
        """(cos, sin) as `__call__` gives them; with `signed`, (cos, signed sin): sin with the
        first half of each row negated, for `rotated_by_signed_sin`."""
        if positions is not None:
            return self.at(positions, T, dtype, device, signed)
        if self.dynamic:
            cos, sin = rotary_embedding(T, self.d_head, self.base, start, dtype=dtype, device=device,
                                        scaling=self.scaling)  # (T, d_head)
            return cos, sin * self.table(1, dtype, device)[2] if signed else sin
        cos, signed_sin, signs = self.table(start + T, dtype, device)  # (L, d_head), L >= start + T
        cos, signed_sin = cos[start:start + T], signed_sin[start:start + T]  # (T, d_head), views
        return cos, signed_sin if signed else signed_sin * signs  # the signs undone: sin, bit for bit

    def table(self, length, dtype, device):
        """The stored tables, grown to at least `length` rows: cos and signed sin, (L, d_head), and
        the signs (d_head,), -1 on the first half and 1 on the second (signed sin = sin * signs)."""
        key = (torch.device(device) if device is not None else torch.device("cpu"), dtype)
        tables = self.tables.get(key)
        if tables is None or len(tables[0]) < length:
            rows = max(length, 2 * (0 if tables is None else len(tables[0])), 64)
            cos, sin = rotary_embedding(rows, self.d_head, self.base, dtype=dtype, device=device,
                                        scaling=self.scaling)  # (rows, d_head)
            half = self.d_head // 2
            signs = torch.ones(self.d_head, dtype=dtype, device=device)
            signs[:half] = -1
            tables = self.tables[key] = cos, sin * signs, signs
        return tables

    def at(self, positions, T, dtype, device, signed=False):
        """The tables at integer positions (..., T): (cos, sin), or (cos, signed sin) with
        `signed`, each (..., 1, T, d_head)."""
        check_is_tensor("positions", positions)
        if positions.is_floating_point() or positions.dtype == torch.bool or positions.shape[-1:] != (T,):
            raise ValueError(f"positions must be integers of shape (..., T) with T={T} (one per new token), "
                             f"got dtype {positions.dtype} and shape {validate.shape_str(positions.shape)}")
        if positions.device != torch.device(device if device is not None else "cpu"):
            raise ValueError(f"positions are on {positions.device}, the queries on {device}: move them with .to()")
        if positions.device.type == "cpu" and not self.dynamic and positions.numel():
            low, high = (int(end) for end in positions.aminmax())
            if 0 <= low and high < self.GATHERED_POSITIONS:
                cos, signed_sin, signs = self.table(high + 1, dtype, device)  # (L, d_head), L > high
                rows = positions.long()  # row numbers (an index of uint8 would be read as a mask)
                sin = signed_sin[rows] if signed else signed_sin[rows] * signs  # (..., T, d_head)
                return cos[rows][..., None, :, :], sin[..., None, :, :]  # (..., 1, T, d_head)
        inv_freq, factor = self.frequencies_for(positions, dtype, device)  # (d/2,)
        angles = positions.to(inv_freq.dtype)[..., None] * inv_freq  # (..., T, d/2)
        angles = torch.cat([angles, angles], dim=-1)[..., None, :, :]  # (..., 1, T, d_head)
        cos, sin = angles.cos(), angles.sin()
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        cos, sin = cos.to(dtype), sin.to(dtype)
        return cos, sin * self.table(1, dtype, device)[2] if signed else sin

    def frequencies_for(self, positions, dtype, device):
        """`rotary_frequencies` for these positions: made once per device and dtype, except for
        dynamic NTK, whose frequencies depend on the length (the largest position + 1)."""
        if self.dynamic:
            return rotary_frequencies(self.d_head, self.base, self.scaling, seq_len=int(positions.max()) + 1,
                                      dtype=dtype, device=device)
        key = (positions.device, dtype)
        if key not in self.frequencies:
            self.frequencies[key] = rotary_frequencies(self.d_head, self.base, self.scaling, dtype=dtype,
                                                       device=device)
        return self.frequencies[key]
