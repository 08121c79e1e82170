"""The step-indexed sampler and the synthetic corpus's entropy."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.config import ConfigError, TrainerConfig
from trainer.data import BigramCorpus, Sampler, token_dataset


def _cfg(**data: object) -> TrainerConfig:
    return TrainerConfig.model_validate({"data": data} if data else {})


def sampler(cfg: TrainerConfig, group: int, groups: int) -> Sampler:
    """The built-in workload's sampler for `cfg` (its [data] source as the dataset)."""
    t = cfg.train
    dataset = token_dataset(cfg.data, cfg.model.vocab_size, t.seq_len, t.seed)
    return Sampler(dataset, t.batch_size, group, groups)


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


def test_samples_depend_only_on_step_group_and_row() -> None:
    cfg = _cfg()
    a, b = sampler(cfg, 0, 2), sampler(cfg, 0, 2)
    cpu = torch.device("cpu")
    full = a.batch(3, range(0, 8), cpu)
    halves = [b.batch(3, range(0, 4), cpu), b.batch(3, range(4, 8), cpu)]
    assert torch.equal(full.inputs, torch.cat([h.inputs for h in halves]))
    assert torch.equal(full.targets[:, :-1], full.inputs[:, 1:])
    other_group = sampler(cfg, 1, 2).batch(3, range(0, 8), cpu)
    other_step = a.batch(4, range(0, 8), cpu)
    assert not torch.equal(full.inputs, other_group.inputs)
    assert not torch.equal(full.inputs, other_step.inputs)


def test_global_index_shards_groups_without_overlap() -> None:
    cfg = _cfg()
    seen = set()
    for group in range(3):
        s = sampler(cfg, group, 3)
        for step in range(4):
            for row in range(cfg.train.batch_size):
                seen.add(s.global_index(step, row))
    assert len(seen) == 3 * 4 * cfg.train.batch_size


def test_text_source_reads_bytes(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("hello phalanx " * 50)
    cfg = TrainerConfig.model_validate(
        {"data": {"source": "text", "path": str(text)}, "model": {"vocab_size": 256}}
    )
    batch = sampler(cfg, 0, 1).batch(0, range(2), torch.device("cpu"))
    raw = text.read_bytes()
    first = bytes(batch.inputs[0].tolist())
    assert first in raw and batch.inputs.max() < 256


def test_tokens_source_checks_vocab_and_length(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    ok = TrainerConfig.model_validate(
        {"data": {"source": "tokens", "path": str(path)}, "model": {"vocab_size": 1000}}
    )
    batch = sampler(ok, 0, 1).batch(5, range(3), torch.device("cpu"))
    assert torch.all(batch.targets - batch.inputs == 1)  # consecutive ids
    small = ok.model_copy(update={"model": ok.model.model_copy(update={"vocab_size": 10})})
    with pytest.raises(ConfigError, match=r"data\.path"):
        sampler(small, 0, 1)
    path.write_bytes(b"\x00\x01\x02")  # not a whole number of uint16
    with pytest.raises(ConfigError, match="token_dtype"):
        sampler(ok, 0, 1)
