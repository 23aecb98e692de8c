"""The command that trains chapter 14's language models: `mha.text.train`, kept here for the maintainers.

    .venv/bin/python -m tools.data.train_lm --preset char --out src/mha/text/trained/char   # retrain a shipped model

It writes into `--out` (default runs/<preset>/), never into the shipped models unless `--out` names them.
"""

import sys

from mha.text.train import main

if __name__ == "__main__":
    sys.exit(main())
