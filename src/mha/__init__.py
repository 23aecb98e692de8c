"""mha: multi-head attention built up one step at a time.

Two faces with the same names: `mha.numpy`, the reference that reads like the
math, and `mha.torch`, trainable modules that run on any device. Import the one
you need: `import mha.numpy as mnp` or `import mha.torch as mt`.

Beside them: `mha.validate` (input checks both faces share), `mha.experiments`
(the chapters' experiments), `mha.checks` (the exercises' checks), `mha.plot`.
Imports only go down: checks and experiments use the faces, the faces use
validate. src/mha/README.md draws the whole house.
"""

__version__ = "0.1.0"
