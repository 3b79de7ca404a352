"""The environment trainer: rollouts of a built-in (or ``module:factory``) environment
through a tree strategy, credit, the update (trainer.py); the same over torchrun ranks
(ranks.py). See docs/architecture.md."""
