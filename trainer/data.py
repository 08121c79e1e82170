"""Deterministic, step-indexed data.

Each replica group consumes ``batch_size`` sequences per optimizer step. Sequence
``row`` of group ``g`` at step ``s`` has the global index::

    ((s * num_groups) + g) * batch_size + row

and its tokens depend only on that index, the seed and the source. A rank reads
only its own rows, the result does not depend on the parallel layout, and any
process can resume at any step: the data position *is* the step.

Sources:

* ``synthetic``: sequences walked from a fixed random bigram model. Each token has
  ``successors`` likely next tokens with random weights, so a model can learn the
  transition table and its loss falls toward the chain's entropy rate, which
  :meth:`BigramCorpus.entropy` reports exactly.
* ``text``: a UTF-8 file read as bytes (vocab 256), cut into consecutive windows.
* ``tokens``: a flat binary file of token ids (memory-mapped), cut the same way.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainer.config import ConfigError, DataConfig, TrainerConfig


class BigramCorpus:
    """A random first-order Markov chain over ``vocab`` tokens with a known entropy rate.

    Each token has ``successors`` possible next tokens with Dirichlet weights. The
    chain is stored sparsely (vocab x successors), so large vocabularies are cheap.
    """

    def __init__(self, vocab: int, successors: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.next_idx = np.stack(
            [rng.choice(vocab, size=successors, replace=False) for _ in range(vocab)]
        )
        self.weights = rng.dirichlet(np.ones(successors), size=vocab)
        self.next_tokens: list[list[int]] = self.next_idx.tolist()
        self.cumulative: list[list[float]] = np.cumsum(self.weights, axis=1).tolist()
        self.stationary = self._stationary()
        self.start_cumulative = list(itertools.accumulate(float(p) for p in self.stationary))

    def prob(self, a: int, b: int) -> float:
        """P(next = b | current = a)."""
        hits = self.weights[a][self.next_idx[a] == b]
        return float(hits.sum())

    def entropy(self) -> float:
        """Entropy rate in nats/token: sum_i pi_i * H(P_i), the best achievable loss."""
        w = self.weights
        per_row = -(w * np.log(w, where=w > 0, out=np.zeros_like(w))).sum(axis=1)
        return float(self.stationary @ per_row)

    def _stationary(self) -> np.ndarray:
        """Stationary distribution by (lazy) power iteration over the sparse rows."""
        pi = np.full(self.vocab, 1.0 / self.vocab)
        for _ in range(10_000):
            nxt = np.zeros(self.vocab)
            np.add.at(nxt, self.next_idx.ravel(), (pi[:, None] * self.weights).ravel())
            nxt = 0.5 * (nxt + pi)  # lazy step, so periodic chains converge too
            done = np.abs(nxt - pi).sum() < 1e-13
            pi = nxt
            if done:
                break
        normalised: np.ndarray = pi / pi.sum()
        return normalised

    def sample(self, length: int, seed_words: list[int]) -> np.ndarray:
        """A walk of ``length`` tokens, started from the stationary distribution."""
        rng = np.random.default_rng(seed_words)
        draws = rng.random(length)
        token = _pick(self.start_cumulative, draws[0])
        out = [token]
        for u in draws[1:]:
            token = self.next_tokens[token][_pick(self.cumulative[token], u)]
            out.append(token)
        return np.asarray(out, dtype=np.int64)


def _pick(cumulative: list[float], u: float) -> int:
    return min(bisect.bisect_right(cumulative, u * cumulative[-1]), len(cumulative) - 1)


class TokenWindows:
    """Consecutive windows of ``length`` tokens from a flat token array."""

    def __init__(self, tokens: np.ndarray, length: int, source: str) -> None:
        if tokens.shape[0] < length + 1:
            raise ConfigError(
                f"data.path {source} holds {tokens.shape[0]} tokens, fewer than train.seq_len + 1 "
                f"({length + 1}); use a longer file or a shorter train.seq_len."
            )
        self.tokens = tokens
        self.length = length
        self.starts = tokens.shape[0] - length  # valid window starts: 0 .. starts-1

    def window(self, index: int) -> np.ndarray:
        start = (index * (self.length - 1)) % self.starts
        return np.asarray(self.tokens[start : start + self.length], dtype=np.int64)


@dataclass
class StepData:
    inputs: torch.Tensor  # [rows, seq_len] int64
    targets: torch.Tensor  # [rows, seq_len] int64


class Sampler:
    """Maps (step, replica group, rows) to token tensors; see the module docstring."""

    def __init__(self, cfg: TrainerConfig, replica_group: int, num_groups: int) -> None:
        self.seed = cfg.train.seed
        self.batch_size = cfg.train.batch_size
        self.seq_len = cfg.train.seq_len
        self.group = replica_group
        self.num_groups = num_groups
        self.corpus: BigramCorpus | None = None
        self.windows: TokenWindows | None = None
        self.vocab = cfg.model.vocab_size
        self._open(cfg.data)

    def _open(self, data: DataConfig) -> None:
        length = self.seq_len + 1
        if data.source == "synthetic":
            self.corpus = BigramCorpus(self.vocab, data.successors, data.corpus_seed)
            return
        assert data.path is not None
        path = Path(data.path)
        if data.source == "text":
            tokens = np.fromfile(path, dtype=np.uint8)
        else:
            itemsize = np.dtype(data.token_dtype).itemsize
            if path.stat().st_size % itemsize:
                raise ConfigError(
                    f"data.path {path} is not a whole number of {data.token_dtype} tokens; "
                    "check data.token_dtype."
                )
            tokens = np.memmap(path, dtype=data.token_dtype, mode="r")
            top = int(tokens.max()) if tokens.shape[0] else 0
            if top >= self.vocab:
                raise ConfigError(
                    f"data.path {path} holds token id {top}, but model.vocab_size is {self.vocab}; "
                    "raise model.vocab_size."
                )
        self.windows = TokenWindows(tokens, length, str(path))

    def entropy(self) -> float | None:
        """Best achievable loss for the synthetic corpus (None for file sources)."""
        return self.corpus.entropy() if self.corpus else None

    def global_index(self, step: int, row: int) -> int:
        return (step * self.num_groups + self.group) * self.batch_size + row

    def sequence(self, step: int, row: int) -> np.ndarray:
        index = self.global_index(step, row)
        if self.corpus is not None:
            return self.corpus.sample(self.seq_len + 1, [self.seed, index])
        assert self.windows is not None
        return self.windows.window(index + self.seed * 7919)

    def batch(self, step: int, rows: range, device: torch.device) -> StepData:
        seqs = np.stack([self.sequence(step, r) for r in rows])
        tokens = torch.from_numpy(seqs).to(device)
        return StepData(inputs=tokens[:, :-1].contiguous(), targets=tokens[:, 1:].contiguous())
