"""Deterministic, step-indexed data.

Step ``s`` trains on items ``[s*B, (s+1)*B)`` of the workload's dataset, ``B`` being
``train.global_batch_size``; trainer/data/shares.py says which group and rank takes which
(the groups of the step's quorum split them). Item ``i`` is ``dataset[i]`` (modulo the
dataset's length, if it has one). So a run reads its dataset in order, the items of a
step do not depend on the parallel layout or on which groups were alive, and any
process can resume at any step: the data position *is* the step.
The dataset is the workload's (trainer/workloads/api.py); the token sources below are
the built-in Llama's, and any sequence workload may use them.

Token sources (items are (tokens, next tokens) of ``seq_len``):

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.config import ConfigError, DataConfig
from trainer.config.checks import check_data_contents


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
                f"data.path {source} holds {tokens.shape[0]} tokens, fewer than train.seq_len + 2 "
                f"({length + 1}); use a longer file or a shorter train.seq_len."
            )
        self.tokens = tokens
        self.length = length
        self.starts = tokens.shape[0] - length + 1  # valid window starts: 0 .. starts-1

    def window(self, index: int) -> np.ndarray:
        start = (index * (self.length - 1)) % self.starts
        return np.asarray(self.tokens[start : start + self.length], dtype=np.int64)


class SyntheticTokens:
    """Item ``i``: a walk of ``seq_len + 1`` tokens of the bigram chain, seeded by (seed, i);
    input and target are the walk shifted by one. Every index is valid."""

    def __init__(self, corpus: BigramCorpus, seq_len: int, seed: int) -> None:
        self.corpus = corpus
        self.seq_len = seq_len
        self.seed = seed

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _shifted(self.corpus.sample(self.seq_len + 1, [self.seed, index]))


class WindowTokens:
    """Item ``i``: window ``i + 7919 * seed`` of a token array (wrapping), shifted by one."""

    def __init__(self, windows: TokenWindows, seed: int) -> None:
        self.windows = windows
        self.offset = seed * 7919

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _shifted(self.windows.window(index + self.offset))


def _shifted(seq: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.from_numpy(seq)
    return tokens[:-1], tokens[1:]


def token_dataset(
    data: DataConfig, vocab: int, seq_len: int, seed: int
) -> SyntheticTokens | WindowTokens:
    """The dataset of a [data] section: synthetic, text (bytes) or tokens."""
    if data.source == "synthetic":
        return SyntheticTokens(
            BigramCorpus(vocab, data.successors, data.corpus_seed), seq_len, seed
        )
    assert data.path is not None
    path = Path(data.path)
    check_data_contents(data, vocab, seq_len)  # the daemon's preflight ran the same check
    if data.source == "text":
        tokens = np.fromfile(path, dtype=np.uint8)
    else:
        tokens = np.memmap(path, dtype=data.token_dtype, mode="r")
    return WindowTokens(TokenWindows(tokens, seq_len + 1, str(path)), seed)


@dataclass
class StepData:
    inputs: torch.Tensor  # [rows, ...]
    targets: torch.Tensor  # [rows, ...]


Collate = Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]]


def stack(items: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The default collate: items are (input, target) pairs of equally shaped tensors."""
    inputs, targets = zip(*items, strict=True)
    return torch.stack(list(inputs)), torch.stack(list(targets))


class Sampler:
    """Reads dataset items by global index into a batch; see the module docstring."""

    def __init__(self, dataset: Any, collate: Collate | None = None) -> None:
        self.dataset = dataset
        self.collate = collate or stack
        self.length: int | None = len(dataset) if hasattr(dataset, "__len__") else None

    def item(self, index: int) -> Any:
        return self.dataset[index % self.length if self.length else index]

    def take(self, items: range, device: torch.device) -> StepData:
        inputs, targets = self.collate([self.item(i) for i in items])
        return StepData(inputs=inputs.to(device), targets=targets.to(device))
