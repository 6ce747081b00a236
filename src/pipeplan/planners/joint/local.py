"""Iterated local search over candidates (docs/joint.md): hill climbing on the
neighbourhood (``moves.py``), scored in batches; then kicks (a few random
moves from the best plan) followed by climbs, until ``patience`` kicks in a row find
nothing better or the budget is spent."""

from __future__ import annotations

import numpy as np

from .candidate import Candidate
from .moves import Space, neighbours
from .score import Scorer


class LocalSearch:
    def __init__(self, scorer: Scorer, space: Space, rng: np.random.Generator) -> None:
        self.scorer, self.space, self.rng = scorer, space, rng

    def _neighbours(self, c: Candidate) -> list[Candidate]:
        return neighbours(c, self.space)

    def climb(self, start: Candidate, score: float, chunk: int = 256) -> tuple[float, Candidate]:
        """Descent from ``start`` to a local optimum (or the end of the budget): the neighbours in a
        random order, scored ``chunk`` at a time; the best of the first chunk holding an
        improvement is taken (so a step costs one chunk while improvements are easy to find,
        and the whole neighbourhood only at the optimum)."""
        best, best_score = start, score
        while not self.scorer.out_of_time():
            options = self._neighbours(best)
            order = self.rng.permutation(len(options))
            improved = False
            for lo in range(0, len(options), chunk):
                scored = self.scorer.score([options[i] for i in order[lo:lo + chunk]])
                s, c = min(scored, key=lambda t: t[0])
                if s < best_score * (1 - 1e-12):
                    best_score, best, improved = s, c, True
                    break
            if not improved:
                break
        return best_score, best

    def kick(self, c: Candidate, moves: int) -> Candidate:
        for _ in range(moves):
            options = self._neighbours(c)
            if not options:
                break
            c = options[int(self.rng.integers(len(options)))]
        return c

    def run(self, starts: list[tuple[float, Candidate]], climbs: int, patience: int) -> tuple[float, Candidate, bool]:
        """Climb from the ``climbs`` best starts, then kick the best until ``patience`` kicks
        in a row fail. Returns (score, candidate, converged: False when the budget stopped it)."""
        starts = sorted(starts, key=lambda t: t[0])
        best_score, best = starts[0]
        for score, c in starts[:climbs]:
            s, c2 = self.climb(c, score)
            if s < best_score:
                best_score, best = s, c2
        failed = 0
        while failed < patience and not self.scorer.out_of_time():
            kicked = self.kick(best, int(self.rng.integers(2, 5)))
            (s0, k0), = self.scorer.score([kicked])
            s, c2 = self.climb(k0, s0)
            if s < best_score * (1 - 1e-12):
                best_score, best, failed = s, c2, 0
            else:
                failed += 1
        return best_score, best, failed >= patience
