"""Training: losses, config, checkpoints, SFT warm start and the online RL loop.

Import submodules directly (``turnrl.train.online``, ``turnrl.train.loss``...);
this package init stays empty so that importing the config does not load torch.
"""
