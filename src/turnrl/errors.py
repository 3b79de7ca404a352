"""The project's own error types: bad input, named where it is.

Every error a user can fix by changing what they gave turnrl (a file, a line of it,
a config key, a command-line option, an output path) is a :class:`TurnrlError`.
``turnrl.cli.main`` turns exactly these into one line on stderr and exit code 2;
anything else is a bug and keeps its traceback.

The subclasses also derive from ``ValueError`` (``OutputError`` from ``OSError``)
so code written against the standard exceptions keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class TurnrlError(Exception):
    """Bad input a user can fix; the message says what and where (exit code 2)."""


class InputError(TurnrlError, ValueError):
    """Bad data in an input (a file, or in-memory records).

    The message always names where: ``SOURCE:LINE: field 'NAME': what is wrong``.
    ``source`` is a file path or ``"<records>"`` for in-memory input, ``line`` is
    1-based (the JSONL line, or the position in the iterable), ``field`` may be
    ``None`` when the problem is the whole line (e.g. malformed JSON); nested
    fields are written as paths (``prompt[2].content``).
    """

    def __init__(self, source: str, line: int | None, field: str | None, problem: str) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.problem = problem
        where = source if line is None else f"{source}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{problem}")

    def __reduce__(self):  # keep the four fields when pickled (Ray, multiprocessing)
        return (type(self), (self.source, self.line, self.field, self.problem))


class TurnRecordError(InputError):
    """A turn record (or a set of them) is invalid."""


class UsageError(TurnrlError, ValueError):
    """A bad command-line option or argument; the message names the option."""


class ConfigError(TurnrlError, ValueError):
    """A bad configuration value; the message names the dotted key.

    ``problems`` holds the ``(dotted key, message)`` pairs when the error reports every
    problem of a config at once (:func:`turnrl.train.validate.validate`, through
    :meth:`from_problems`); it is empty for an error raised about one value.
    """

    def __init__(self, message: str, problems: Sequence[tuple[str, str]] = ()) -> None:
        self.problems = list(problems)
        super().__init__(message)

    @classmethod
    def from_problems(
        cls, problems: Sequence[tuple[str, str]], where: Mapping[str, str] | None = None
    ) -> ConfigError:
        """One error listing ``problems``; ``where`` maps a key to where its value came
        from (``file.toml:12`` or ``override 'train.steps=-1'``), which prefixes the key."""
        located = where or {}
        lines = [
            f"{located[key]}: {key}: {message}" if key in located else f"{key}: {message}"
            for key, message in problems
        ]
        if len(lines) == 1:
            text = f"config error: {lines[0]}"
        else:
            text = f"{len(lines)} config errors:\n" + "\n".join("  " + line for line in lines)
        return cls(text, problems)

    def __reduce__(self):  # keep the problems when pickled (Ray, multiprocessing)
        return (type(self), (str(self), self.problems))


class CapabilityError(TurnrlError, TypeError):
    """An environment lacks an optional capability (``turnrl.types.Snapshots``...) that
    what it is used for needs; the message names both."""


class SamplerServerError(TurnrlError, RuntimeError):
    """A sampling server (``policy.backend = "vllm-server"``) that cannot be used as
    configured: unreachable, an HTTP error, a malformed answer, or a missing route; the
    message names the URL (and the field) and how to start the server instead.
    ``status`` is the HTTP status, when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self):  # keep the status when pickled
        return (type(self), (str(self), self.status))


class OutputError(TurnrlError, OSError):
    """An output path turnrl cannot or will not write (the message names it)."""


class ParameterError(UsageError, TypeError):
    """An unknown parameter, or a value of the wrong type, for a named function
    (an estimator's ``params``); a ``TypeError`` too, as Python's own would be."""
