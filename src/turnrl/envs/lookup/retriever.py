"""BM25 over a knowledge base's fact lines, with ``bm25s`` (the ``lookup`` extra).

Scores come from ``bm25s`` (Lucene BM25, k1 = 1.5, b = 0.75): words of two or
more letters, lower-cased, no stop words, no stemming. Only the ranking is done
here, so that it is deterministic: facts with a positive score, best first,
ties broken by fact position. A fact that shares no word with the query is
never returned, so a search can come back empty.

``bm25s`` is imported when an index is first built, so ``import turnrl.envs``
works without the extra. Indices are cached per fact tuple: every episode of a
task reuses its task's index.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

MAX_QUERY_CHARS = 200
"""Longer queries are cut: the agent's text is untrusted, and scoring stays bounded."""


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the lookup environment needs bm25s: pip install 'turnrl[lookup]'"
        ) from err
    return bm25s


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """The words BM25 sees in each text (bm25s's tokenizer, no stop words)."""
    return _bm25s().tokenize(list(texts), stopwords=None, return_ids=False, show_progress=False)


class FactIndex:
    """A BM25 index over fact lines; :meth:`search` returns fact indices."""

    def __init__(self, texts: Sequence[str]) -> None:
        bm25s = _bm25s()
        self.texts = tuple(texts)
        self._bm25 = bm25s.BM25()
        self._bm25.index(
            bm25s.tokenize(list(self.texts), stopwords=None, show_progress=False),
            show_progress=False,
        )

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every fact for ``query`` (zeros when the query has no word)."""
        words = tokenize([query[:MAX_QUERY_CHARS]])[0]
        if not words or not self.texts:
            return np.zeros(len(self.texts))
        return np.asarray(self._bm25.get_scores(words), dtype=np.float64)

    def search(self, query: str, k: int) -> list[int]:
        """Indices of the (at most) ``k`` best-scoring facts with a positive score."""
        scores = self.scores(query)
        order = np.lexsort((np.arange(len(scores)), -scores))  # score desc, then position
        return [int(i) for i in order[:k] if scores[i] > 0]


@lru_cache(maxsize=4096)
def fact_index(texts: tuple[str, ...]) -> FactIndex:
    """The (cached) index of one knowledge base's fact lines."""
    return FactIndex(texts)
