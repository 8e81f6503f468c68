"""The fleet: which versions are served and which workers hold them.

The catalogue (what may be served and how a request chooses a version), placement (which
version each worker holds, switched by what a switch costs), rollouts, the scaling rule (how
many workers the pool should have) and the composite core that routes the pool's events to
one dispatch core per version (`ModelCores`). It builds on the dispatch kernel (`failover`)
and decides; the kernel's owner carries out what it decides.
"""

from failover.fleet.capacity import LATE_SHARE, STEP_S, Capacity, CapacityGauges, Idle
from failover.fleet.catalogue import (
    Catalogue,
    CatalogueError,
    ModelConfig,
    UnknownModel,
    VersionConfig,
    choose,
    key,
    load_catalogue,
    parse_catalogue,
    split_key,
)
from failover.fleet.cores import ROLLOUT_TIMEOUT_S, ModelCores, VersionState
from failover.fleet.loads import KINDS, MEASURE_WEIGHT, Loads, Switching
from failover.fleet.placement import (
    REASONS,
    LruOnDemand,
    Placement,
    PlacementSettings,
    Switch,
    SwitchCost,
    VersionView,
    WorkerView,
    initial_placement,
    load_eta,
)
from failover.fleet.rule import SCALE_REASONS, Decision, Scaler, ScalerSettings, Start

__all__ = [
    "KINDS",
    "LATE_SHARE",
    "MEASURE_WEIGHT",
    "REASONS",
    "ROLLOUT_TIMEOUT_S",
    "SCALE_REASONS",
    "STEP_S",
    "Capacity",
    "CapacityGauges",
    "Catalogue",
    "CatalogueError",
    "Decision",
    "Idle",
    "Loads",
    "LruOnDemand",
    "ModelConfig",
    "ModelCores",
    "Placement",
    "PlacementSettings",
    "Scaler",
    "ScalerSettings",
    "Start",
    "Switch",
    "SwitchCost",
    "Switching",
    "UnknownModel",
    "VersionConfig",
    "VersionState",
    "VersionView",
    "WorkerView",
    "choose",
    "initial_placement",
    "key",
    "load_catalogue",
    "load_eta",
    "parse_catalogue",
    "split_key",
]
