"""Capacity that follows the load: the rule that decides how many workers the pool should
have (`Scaler`), from offered arrivals, the queue and the starts in flight. Pure and
clocked by its caller; the dispatch core feeds it and carries out what it decides."""

from failover.scaling.rule import SCALE_REASONS, Decision, Scaler, ScalerSettings, Start

__all__ = ["SCALE_REASONS", "Decision", "Scaler", "ScalerSettings", "Start"]
