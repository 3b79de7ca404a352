"""Iterative GRPO: deploy, fit a turn-level Q function, improve against it offline.

``loop`` (the trainer), ``config``, ``qmodel`` (the Q function and its fit),
``chatlogs`` (logged conversations as input), ``explore`` (exploration personas
and temperatures). See docs/iterative-grpo.md and docs/architecture.md.
"""
