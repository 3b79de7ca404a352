"""``turnrl`` command line with the tests' ``parity`` environment registered: what the
distributed tests launch under torchrun (``python -m torch.distributed.run ... tests/
distributed_entry.py train ...``) and as one process, so both see the same environments."""

import sys

import conftest  # noqa: F401  (registers the "parity" environment)
from turnrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
