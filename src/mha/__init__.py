"""mha: multi-head attention built up one step at a time.

Two faces with the same names: `mha.numpy`, the reference that reads like the
math, and `mha.torch`, trainable modules that run on any device. Import the one
you need: `from mha import numpy as mnp` or `import mha.torch as mt`.
"""

__version__ = "0.1.0"
