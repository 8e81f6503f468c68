"""`ModelCores` as a hypothesis state machine, in exact virtual time.

Three models, six versions, four workers: requests for each model and version in both
tiers (named, by default, by weights, stale), cancellations and waiters timing out;
workers answering, failing, stalling (hedged), dying (before or after the cores decided to
switch them), loads finishing or dying; versions retired, defaults moved (rollouts),
weights set, the file re-read. The world (`driver.World`: the real owner over the contract
pool, in virtual time) checks every action as the owner carries it out: a batch holds one
version and goes to a worker holding it, a worker is switched only idle and sent nothing
after, no version loads twice at once, a worker keeps its version for the minimum
residency unless retired, a rollout moves only onto a version resident on as many workers;
a cold refusal carries a finite Retry-After and asks the owner for a turn. After every
step each item is answered at most once with its own version's output; after a healthy
while and the drain, every request not cancelled exactly once.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from batcher import BatchgateError, Item, Tier, VersionKey
from failover.errors import ModelLoading, UnknownModel
from failover.fleet.catalogue import Catalogue, CatalogueError
from failover.fleet.versions import ROLLOUT_TIMEOUT_S
from tests.failover.fleet.driver import MAX_WAIT, World, finite_positive


def version(load_s: float) -> dict[str, object]:
    return {"spec": "sim", "load_s": load_s}


CATALOGUE = Catalogue.from_dict({"models": {
    "a": {"default": "v1", "min_workers": 1,
          "versions": {"v1": version(0.3), "v2": version(0.6), "v3": version(1.5)}},
    "b": {"min_workers": 0, "idle_unload_s": 3, "versions": {"v1": version(0.6)}},
    "c": {"default": "v1", "min_workers": 0, "max_workers": 1, "idle_unload_s": 5,
          "versions": {"v1": version(0.3), "v2": version(0.3)}},
}})
WITHOUT_C = Catalogue({n: m for n, m in CATALOGUE.models.items() if n != "c"})
KEYS = ["a@v1", "a@v2", "a@v3", "b@v1", "c@v1", "c@v2"]
NAMES = [None, "a", "b", "c", *KEYS]
TIMEOUTS = [0.08, 0.3, 2.0, 5.0]


class CoresMachine(RuleBasedStateMachine):
    """Rules draw from every name of `CATALOGUE`; a machine over another catalogue (a
    subclass) meets the names it does not serve as a client would."""

    files = (CATALOGUE, WITHOUT_C)  # what SIGHUP may find: the first is served at start
    workers = 4

    def __init__(self) -> None:
        super().__init__()
        self.w = World(self.files[0], self.workers)
        self.stickies = 0

    # -- requests ------------------------------------------------------------------------
    def resolved(self, model: str | None) -> str | None:
        """The version the cores give a request naming `model`, checked. Every request
        carries an Idempotency-Key: a weighted choice without one is random, and hypothesis
        must replay a run exactly."""
        cores = self.w.cores
        self.stickies += 1
        key = f"k{self.stickies}"
        try:
            got = cores.resolve(model, key)
        except UnknownModel:
            assert model is not None and model not in cores.catalogue.versions()
            assert "@" in model or model not in cores.catalogue.models, f"{model} unknown"
            return None
        assert got in cores.catalogue.versions(), f"{model} resolved to {got}, not live"
        parsed = VersionKey.parse(got)
        name, _ = parsed.model, parsed.version
        config = cores.catalogue.models[name]
        if (model is None or "@" not in model) and not config.weights:
            assert got == f"{name}@{cores.serving_default(name)}"
        return got

    def refused(self, items: list[Item], refusal: BaseException) -> None:
        assert isinstance(refusal, BatchgateError), refusal
        version = items[0].version
        if isinstance(refusal, ModelLoading):
            assert finite_positive(refusal.retry_after), refusal.retry_after
            state = {v.version: v for v in self.w.cores.versions(self.w.now)}[version]
            assert state.resident == 0, f"{version} refused as loading with a worker"
        if version not in self.w.cores.catalogue.versions():
            assert isinstance(refusal, UnknownModel), f"{version} retired, yet {refusal!r}"
        for item in items:
            del self.w.items[item.id]

    @rule(model=st.sampled_from(NAMES), tier=st.sampled_from(Tier), n=st.integers(1, 4),
          timeout=st.sampled_from(TIMEOUTS))
    def admit(self, model: str | None, tier: Tier, n: int, timeout: float) -> None:
        version = self.resolved(model)
        if version is not None:
            self.admit_version(version, tier, n, timeout)

    @rule(key=st.sampled_from(KEYS), tier=st.sampled_from(Tier),
          timeout=st.sampled_from(TIMEOUTS))
    def admit_stale(self, key: str, tier: Tier, timeout: float) -> None:
        """Items resolved before a change (a retire) reach the cores after it."""
        self.admit_version(key, tier, 1, timeout)

    def admit_version(self, version: str, tier: Tier, n: int, timeout: float) -> None:
        items = self.w.new_items(version, tier, n, timeout)
        try:
            self.w.admit(items, timeout)
        except BatchgateError as exc:
            self.refused(items, exc)

    @rule(frame=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(Tier),
                                   st.integers(1, 3), st.sampled_from([0.3, 5.0])),
                         min_size=1, max_size=6))
    def admit_frame(self, frame: list[tuple[str | None, Tier, int, float]]) -> None:
        requests = []
        for model, tier, n, timeout in frame:
            version = self.resolved(model)
            if version is not None:
                requests.append((self.w.new_items(version, tier, n, timeout), timeout))
        refusals, must = self.w.admit_all(requests)
        for (items, _), refusal in zip(requests, refusals, strict=True):
            if refusal is not None:
                self.refused(items, refusal)
        cold = any(isinstance(r, ModelLoading) for r in refusals)
        assert must or not cold, "a cold refusal asks for a turn (placement may load)"

    @precondition(lambda self: self.w.requests)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.w.cancel(self.w.requests[data.draw(st.integers(0, len(self.w.requests) - 1))])

    @rule()
    def waiters_time_out(self) -> None:
        self.w.time_out_waiters()

    # -- the pool ------------------------------------------------------------------------
    @precondition(lambda self: any(self.w.up(w) for w in self.w.flights))
    @rule(data=st.data(), kind=st.sampled_from(["ok", "ok", "ok", "error", "short"]))
    def reply(self, data: st.DataObject, kind: str) -> None:
        worker = data.draw(st.sampled_from(sorted(w for w in self.w.flights if self.w.up(w))))
        self.w.answer(worker, kind)

    @precondition(lambda self: any(s.state == "up" for s in self.w.slots))
    @rule(data=st.data(), report=st.booleans())
    def die(self, data: st.DataObject, report: bool) -> None:
        """A worker dies; with `report` False the cores hear of it only later, and may
        meanwhile send it a batch or decide to switch it."""
        slot = data.draw(st.sampled_from([s for s in self.w.slots if s.state == "up"]))
        self.w.die(slot.worker)
        if report:
            self.w.report_deaths()

    @precondition(lambda self: self.w.deaths)
    @rule()
    def report_deaths(self) -> None:
        self.w.report_deaths()

    @precondition(lambda self: any(s.state == "loading" for s in self.w.slots))
    @rule(data=st.data(), fails=st.sampled_from([False, False, False, True]))
    def load_ends(self, data: st.DataObject, fails: bool) -> None:
        slot = data.draw(st.sampled_from([s for s in self.w.slots if s.state == "loading"]))
        if fails:
            self.w.load_failed(slot)
        else:
            self.w.ready(slot)

    @rule(dt=st.sampled_from([0.001, 0.05, 0.1, 0.4, 1.2, 3.0]))
    def tick(self, dt: float) -> None:
        self.w.advance(self.w.now + dt)

    @rule(seconds=st.sampled_from([0.3, 2.0]))
    def healthy_while(self, seconds: float) -> None:
        """Batches answered in LATENCY, loads done in their hint: rollouts move on."""
        self.w.run(self.w.now + seconds)

    # -- the catalogue changed while serving -----------------------------------------------
    def serve(self, catalogue: Catalogue) -> None:
        """Hand the cores a new catalogue as the admin API does, in the owner's turn. A
        serving default moves at once only off a version no longer live."""
        cores = self.w.cores
        before = {m: cores.serving_default(m) for m in cores.catalogue.models}

        def moved_only_off_the_retired() -> None:
            for name, old in before.items():
                if name in catalogue.models and cores.serving_default(name) != old:
                    assert f"{name}@{old}" not in catalogue.versions(), (
                        f"{name}'s default left the live {old} at once")

        self.w.serve(catalogue, moved_only_off_the_retired)

    @rule(key=st.sampled_from(KEYS))
    def retire(self, key: str) -> None:
        parsed = VersionKey.parse(key)
        name, short = parsed.model, parsed.version
        try:
            catalogue = self.w.cores.catalogue.retire(name, short)
        except CatalogueError:
            assert short == self.w.cores.catalogue.models[name].default
            return
        except LookupError:  # not in this catalogue
            assert name not in self.w.cores.catalogue.models or short not in \
                self.w.cores.catalogue.models[name].versions
            return
        self.serve(catalogue)
        assert key not in self.w.cores.catalogue.versions()

    @rule(key=st.sampled_from(KEYS))
    def set_default(self, key: str) -> None:
        parsed = VersionKey.parse(key)
        name, short = parsed.model, parsed.version
        if key in self.w.cores.catalogue.versions():
            self.serve(self.w.cores.catalogue.with_settings(name, default=short))

    @rule(split=st.sampled_from([None, 50, 90]))
    def set_weights(self, split: int | None) -> None:
        """Model a's weights: none, or `split` percent to its default, the rest to its
        first other live version."""
        model = self.w.cores.catalogue.models.get("a")
        if model is None:
            return
        others = [v for v in model.live() if v != model.default]
        if split is None or not others:
            weights: dict[str, int] = {}
        else:
            weights = {model.default: split, others[0]: 100 - split}
        self.serve(self.w.cores.catalogue.with_settings("a", weights=weights))

    @rule(which=st.integers(0, 1))
    def reload(self, which: int) -> None:
        """SIGHUP re-reads the file: as it was at start (retired versions live again), or
        with a model or versions gone (their queues finish, their workers leave)."""
        self.serve(self.files[which])

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def answered_at_most_once_with_its_versions_output(self) -> None:
        self.w.check_settled()

    @invariant()
    def no_item_waits_past_max_wait_with_a_worker_of_its_version_idle(self) -> None:
        stats = self.w.cores.statistics_by_version(self.w.now)
        for item in self.w.queued.values():
            table = stats[item.version].table if item.version in stats else None
            if table is None or table.idle - table.pending_groups <= 0:
                continue
            if not item.cancelled and item.deadline > self.w.now:
                assert self.w.now < item.enqueued + MAX_WAIT + 1e-9, "waited, a worker free"

    def teardown(self) -> None:
        """A healthy pool past every deadline, then the drain: every request not
        cancelled is answered exactly once."""
        try:
            self.w.report_deaths()
            self.w.run(self.w.now + max(TIMEOUTS) + 1.0)
            self.w.drain()
            left = self.w.unanswered()
            assert not left, f"{len(left)} items never answered, e.g. {left[0]}"
            self.w.check_settled()
            if self.w.now < ROLLOUT_TIMEOUT_S:
                assert all(new_on >= max(1, old_on) for *_, new_on, old_on in self.w.spy.flips)
        finally:
            self.w.close()


TestCores = CoresMachine.TestCase
TestCores.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)
