"""What the tests of mha.numpy's heads across devices share (tests/test_sharding_numpy.py,
test_sharding_ring_numpy.py, test_sharding_bytes_numpy.py): the tolerance against one process, seeded
generators, and warnings made errors."""

import warnings
from contextlib import contextmanager

import numpy as np

TOL = 1e-12  # float64: a scheme against one process's attention


def rng(seed=0):
    return np.random.default_rng(seed)


@contextmanager
def warnings_as_errors():
    """Any warning raises, and NumPy's floating-point ones (overflow, invalid value, divide by zero) too."""
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        yield
