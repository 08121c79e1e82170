"""Steps voted down for a NaN or infinite loss or gradient norm, counted in a row.

Every group sees the same averaged gradients, so every group votes such a step down
and retries it with the same data. ``train.max_skipped_steps`` attempts in a row end
the job with :class:`NonFiniteTraining` (a diverged run does not heal by retrying).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer import logs
from trainer.contracts import rank_events as events


class NonFiniteTraining(RuntimeError):
    """train.max_skipped_steps steps in a row were not finite: the job stops."""


@dataclass
class NonFiniteStreak:
    limit: int  # train.max_skipped_steps
    speaks: bool  # this rank reports (rank 0 of the group)
    in_a_row: int = 0

    def committed(self) -> None:
        self.in_a_row = 0

    def voted_down(self, step: int, loss: float, grad_norm: float) -> None:
        """Count a step voted down for a NaN/inf; `limit` in a row raise NonFiniteTraining."""
        self.in_a_row += 1
        if self.speaks:
            logs.get().warning(
                events.STEP_NOT_FINITE,
                step=step + 1,  # the step attempted, numbered as train_step numbers it
                loss=loss if math.isfinite(loss) else str(loss),
                grad_norm=grad_norm if math.isfinite(grad_norm) else str(grad_norm),
                in_a_row=self.in_a_row,
                limit=self.limit,
            )
        if self.in_a_row >= self.limit:
            raise NonFiniteTraining(
                f"{self.in_a_row} step attempts in a row up to step {step + 1} had a non-finite "
                f"loss or gradient norm (train.max_skipped_steps = {self.limit}); none was "
                "committed. Lower train.lr or check the data, then resume from the checkpoint."
            )
