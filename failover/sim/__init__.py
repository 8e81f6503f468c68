"""The simulator: the real core in virtual time.

One event simulation that runs the real `CoreOwner` driving the real fleet
(`failover.fleet.ModelCores`, built as the service builds it) over a pool of contract
workers (`ContractPool`: the `gpu_pool.Pool` seam, each batch taking its version's fixed
latency, each start its load time, deaths injectable), called by seeded Poisson streams of
requests (`Stream`), on an asyncio loop whose clock jumps from one event to the next
(`VirtualLoop`). A `World` says what runs; `simulate` runs it and returns its `Outcome`:
latency per stream and tier, refusals and failures by type, batches and their fill,
placement's loads, the rule's scale events, GPU-seconds, and events per second of real
time. The same world gives the same outcome.

The planner (`batchgate plan`), the models and scaling simulations (`loadtest.sim_models`,
`loadtest.sim_scaling`) stand on it, and so do the tests' worlds of the fleet: the same
owner and pool, driven step by step (`Steps`), the pool directed event by event
(`DirectedPool`).
"""

from failover.sim.arrivals import Schedule, Stream, constant, given, merged, varying
from failover.sim.clients import Clients
from failover.sim.directed import DirectedPool
from failover.sim.loop import EPSILON_S, VirtualLoop, VirtualTimeError, run_virtual
from failover.sim.meter import Counts, Figures, Held
from failover.sim.outcome import Outcome
from failover.sim.pool import ContractPool, Death, SlotView, echo
from failover.sim.record import Record, Request, Tally
from failover.sim.steps import Steps
from failover.sim.world import VERSION, Model, Rule, World, simulate

__all__ = [
    "EPSILON_S",
    "VERSION",
    "Clients",
    "ContractPool",
    "Counts",
    "Death",
    "DirectedPool",
    "Figures",
    "Held",
    "Model",
    "Outcome",
    "Record",
    "Request",
    "Rule",
    "Schedule",
    "SlotView",
    "Steps",
    "Stream",
    "Tally",
    "VirtualLoop",
    "VirtualTimeError",
    "World",
    "constant",
    "echo",
    "given",
    "merged",
    "run_virtual",
    "simulate",
    "varying",
]
