"""The fleet: which versions are served and which workers hold them.

The catalogue (what may be served and how a request chooses a version), placement (which
version each worker holds, switched by what a switch costs), rollouts, the scaling rule (how
many workers the pool should have), the ledger of starts (every worker on its way, once),
and the composite core that routes the pool's events to one dispatch core per version
(`ModelCores`: `Versions` says which version a request gets, `Residency` which worker holds
what, `Placing` carries placement out). It builds on the dispatch kernel (`failover`)
and decides; the kernel's owner carries out what it decides.
"""

from failover.fleet.capacity import (
    STEP_S,
    Capacity,
    CapacityGauges,
    Idle,
    Scaling,
    pool_throughput,
)
from failover.fleet.catalogue import (
    STARTS,
    Catalogue,
    CatalogueError,
    ModelConfig,
    NotInCatalogue,
    VersionConfig,
    check_change,
    choose,
    load_catalogue,
    parse_catalogue,
)
from failover.fleet.cores import ModelCores
from failover.fleet.fitting import check_fits, unreachable
from failover.fleet.guard_keys import GUARD_KEYS
from failover.fleet.ledger import LATE_SHARE, MEASURE_WEIGHT, Kind, Ledger, Start
from failover.fleet.placement import (
    REASONS,
    LruOnDemand,
    Placement,
    PlacementSettings,
    Switch,
    SwitchCost,
    SwitchReason,
    VersionView,
    WorkerView,
    initial_placement,
    load_eta,
    queued_batches,
)
from failover.fleet.placing import Placing, VersionState, VersionStatus
from failover.fleet.residency import DEFAULT_LOAD_S, Residency
from failover.fleet.routing import Routing
from failover.fleet.rule import SCALE_REASONS, Decision, Scaler, ScaleReason, ScalerSettings
from failover.fleet.sizing import Sizing
from failover.fleet.versions import ROLLOUT_TIMEOUT_S, Versions

__all__ = [
    "DEFAULT_LOAD_S",
    "GUARD_KEYS",
    "LATE_SHARE",
    "MEASURE_WEIGHT",
    "REASONS",
    "ROLLOUT_TIMEOUT_S",
    "SCALE_REASONS",
    "STARTS",
    "STEP_S",
    "Capacity",
    "CapacityGauges",
    "Catalogue",
    "CatalogueError",
    "Decision",
    "Idle",
    "Kind",
    "Ledger",
    "LruOnDemand",
    "ModelConfig",
    "ModelCores",
    "NotInCatalogue",
    "Placement",
    "PlacementSettings",
    "Placing",
    "Residency",
    "Routing",
    "ScaleReason",
    "Scaler",
    "ScalerSettings",
    "Scaling",
    "Sizing",
    "Start",
    "Switch",
    "SwitchCost",
    "SwitchReason",
    "VersionConfig",
    "VersionState",
    "VersionStatus",
    "VersionView",
    "Versions",
    "WorkerView",
    "check_change",
    "check_fits",
    "choose",
    "initial_placement",
    "load_catalogue",
    "load_eta",
    "parse_catalogue",
    "pool_throughput",
    "queued_batches",
    "unreachable",
]
