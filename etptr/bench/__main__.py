"""``python -m etptr.bench``: the ``etptr-bench`` command (see ``--help``)."""
import sys

from etptr.bench._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
