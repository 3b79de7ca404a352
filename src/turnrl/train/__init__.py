"""Training: the run lifecycle, config, the shared update, and the three trainers.

The shared core and the environment trainer (``online``) are modules here; the
agent loop is the ``agent`` package and Iterative GRPO the ``iterate`` package
(docs/architecture.md has the file map). All three implement
:class:`turnrl.train.lifecycle.Trainer` and run through
:class:`turnrl.train.lifecycle.Lifecycle`, which owns the order of a run.

Import submodules directly (``turnrl.train.online.trainer``, ``turnrl.train.update.loss``...);
this package init stays empty so that importing the config does not load torch.
"""
