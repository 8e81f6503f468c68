"""Several models and versions on one pool: the catalogue (what may be served and how
requests choose a version), placement (which version each worker holds, switched by what a
switch costs), and the dispatch core over one core per version (`ModelCores`)."""

from failover.models.catalogue import (
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
from failover.models.cores import ROLLOUT_TIMEOUT_S, ModelCores, VersionState
from failover.models.placement import (
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

__all__ = [
    "REASONS",
    "ROLLOUT_TIMEOUT_S",
    "Catalogue",
    "CatalogueError",
    "LruOnDemand",
    "ModelConfig",
    "ModelCores",
    "Placement",
    "PlacementSettings",
    "Switch",
    "SwitchCost",
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
