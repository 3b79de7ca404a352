"""The agent loop: train any program that speaks the OpenAI chat API, unchanged.

``loop`` (the trainer, read top to bottom), ``tasks`` (task files), ``programs``
(running one agent: entrypoint or command), ``runner`` (a step's rollouts against
the gateway), ``teacher`` (the scripted warm-start teacher). See
docs/architecture.md.
"""
