"""The step-indexed sampler and the synthetic corpus's entropy."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.config import ConfigError, TrainerConfig
from trainer.data.sources import BigramCorpus, Sampler, token_dataset


def _cfg(**data: object) -> TrainerConfig:
    return TrainerConfig.model_validate({"data": data} if data else {})


def sampler(cfg: TrainerConfig) -> Sampler:
    """The built-in workload's sampler for `cfg` (its [data] source as the dataset)."""
    t = cfg.train
    dataset = token_dataset(cfg.data, cfg.model.vocab_size, t.seq_len, t.seed)
    return Sampler(dataset)


def test_stationary_distribution_is_fixed_point() -> None:
    corpus = BigramCorpus(vocab=32, successors=3, seed=7)
    pi = corpus.stationary
    dense = np.array([[corpus.prob(a, b) for b in range(32)] for a in range(32)])
    assert np.allclose(dense.sum(axis=1), 1.0)
    assert np.allclose(pi @ dense, pi, atol=1e-10)
    assert math.isclose(pi.sum(), 1.0)


def test_large_vocabularies_stay_small() -> None:
    """The chain is sparse: a 32k vocabulary costs megabytes, not gigabytes."""
    corpus = BigramCorpus(vocab=32000, successors=4, seed=1)
    assert corpus.next_idx.nbytes + corpus.weights.nbytes < 4_000_000
    assert 0 < corpus.entropy() < math.log(4) + 1e-9


def test_entropy_matches_the_empirical_loss_of_the_true_model() -> None:
    """The reported entropy is what a perfect bigram predictor scores on samples."""
    corpus = BigramCorpus(vocab=64, successors=4, seed=1234)
    nll, count = 0.0, 0
    for i in range(300):
        seq = corpus.sample(65, [0, i])
        for a, b in itertools.pairwise(seq):
            nll -= math.log(corpus.prob(int(a), int(b)))
            count += 1
    assert nll / count == pytest.approx(corpus.entropy(), rel=0.03)
    assert corpus.entropy() < math.log(64) / 2


def test_items_depend_only_on_their_index() -> None:
    cfg = _cfg()
    a, b = sampler(cfg), sampler(cfg)
    cpu = torch.device("cpu")
    full = a.take(range(24, 32), cpu)
    halves = [b.take(range(24, 28), cpu), b.take(range(28, 32), cpu)]
    assert torch.equal(full.inputs, torch.cat([h.inputs for h in halves]))
    assert torch.equal(full.targets[:, :-1], full.inputs[:, 1:])
    assert not torch.equal(full.inputs, a.take(range(32, 40), cpu).inputs)


def test_text_source_reads_bytes(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("hello phalanx " * 50)
    cfg = TrainerConfig.model_validate(
        {"data": {"source": "text", "path": str(text)}, "model": {"vocab_size": 256}}
    )
    batch = sampler(cfg).take(range(2), torch.device("cpu"))
    raw = text.read_bytes()
    first = bytes(batch.inputs[0].tolist())
    assert first in raw and batch.inputs.max() < 256


def test_tokens_source_checks_vocab_and_length(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    ok = TrainerConfig.model_validate(
        {"data": {"source": "tokens", "path": str(path)}, "model": {"vocab_size": 1000}}
    )
    batch = sampler(ok).take(range(15, 18), torch.device("cpu"))
    assert torch.all(batch.targets - batch.inputs == 1)  # consecutive ids
    small = ok.model_copy(update={"model": ok.model.model_copy(update={"vocab_size": 10})})
    with pytest.raises(ConfigError, match=r"data\.path"):
        sampler(small)
    path.write_bytes(b"\x00\x01\x02")  # not a whole number of uint16
    with pytest.raises(ConfigError, match="token_dtype"):
        sampler(ok)
