"""Long inputs against the whole dispatch core, in exact virtual time.

Workers cost what `tests.models:slowlong` costs (8 s per MB of input, 0.1 s at least), so a
batch's time grows with its characters, as a real model's does. Paid requests of one short
input arrive every 100 ms, and a free request of 100 inputs of 10,000 characters every
3 s; the door's part is played here: a refusal is the request's answer, and a request still
unanswered at its deadline is cancelled (504). Issue 28, item 6.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from batcher import BatchgateError, FlushPolicy, Item, ItemId, Tier
from failover import CoreActions, CoreSettings, build_core
from gpu_pool import Ok, WorkerId

BUDGETS = {Tier.PAID: 0.4, Tier.FREE: 0.25}
TIMEOUTS = {Tier.PAID: 5.0, Tier.FREE: 2.0}
LONG = "x" * 10_000


def slowlong(texts: tuple[str, ...]) -> float:
    return max(0.1, 8.0 * sum(map(len, texts)) / 1e6)


@dataclass
class Request:
    tier: Tier
    arrived: float
    left: int
    items: list[Item] = field(default_factory=list)
    answer: str | None = None  # "200", "504" or the refusal's code
    latency: float = math.nan


@dataclass
class Run:
    """The door and the pool around one core: every event in time order."""

    workers: int = 2
    max_batch_chars: int | None = None
    now: float = 0.0
    requests: list[Request] = field(default_factory=list)
    sent: list[tuple[str, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        cap = self.max_batch_chars
        self.core = build_core(CoreSettings(
            budgets=BUDGETS, policy=FlushPolicy() if cap is None else FlushPolicy(
                max_batch_chars=cap),
            initial_latency=0.01,  # what the service assumes of a model that pads nothing
        ))
        self.ends: list[tuple[float, int, WorkerId, Ok]] = []
        self.seq = 0
        self.ids = 0
        for w in range(self.workers):
            self.perform(self.core.worker_ready(WorkerId(w + 1), 0.0))

    def item_done(self, item: Item, result: str | BaseException) -> None:
        request = self.requests[item.index]
        assert isinstance(result, str), result
        request.left -= 1
        if request.left == 0:
            request.answer, request.latency = "200", self.now - request.arrived

    def perform(self, actions: CoreActions) -> None:
        for send in actions.send:
            self.sent.append(send.run.inputs)
            seconds = slowlong(send.run.inputs)
            ok = Ok(send.run.batch_id, tuple(t[::-1] for t in send.run.inputs), seconds)
            heapq.heappush(self.ends, (self.now + seconds, self.seq, send.worker, ok))
            self.seq += 1
        for item, result in actions.settle:
            item.settle(result)

    def post(self, tier: Tier, texts: list[str]) -> None:
        request = Request(tier, self.now, len(texts))
        index = len(self.requests)
        self.requests.append(request)
        deadline = self.now + TIMEOUTS[tier]
        for text in texts:
            self.ids += 1
            request.items.append(Item(ItemId(self.ids), text, tier, self.now, deadline, self,
                                      index))
        try:
            self.core.admit(request.items, TIMEOUTS[tier], self.now)
        except BatchgateError as exc:
            request.answer = exc.code

    def expire(self) -> None:
        for request in self.requests:
            if request.answer is None and self.now >= request.arrived + TIMEOUTS[request.tier]:
                request.answer = "504"
                for item in request.items:
                    self.core.cancel(item)

    def until(self, end: float, arrivals: list[tuple[float, Tier, list[str]]]) -> None:
        arrivals = sorted(arrivals, key=lambda a: a[0])
        i = 0
        while True:
            timeouts = [r.arrived + TIMEOUTS[r.tier] for r in self.requests if r.answer is None]
            t = min(arrivals[i][0] if i < len(arrivals) else math.inf,
                    self.ends[0][0] if self.ends else math.inf,
                    self.core.next_deadline(), min(timeouts, default=math.inf))
            if t > end:
                return
            self.now = max(self.now, t)
            actions = CoreActions()
            while self.ends and self.ends[0][0] <= self.now:
                _, _, worker, ok = heapq.heappop(self.ends)
                actions.extend(self.core.reply(worker, ok, self.now, self.now))
            self.perform(actions)
            self.expire()
            while i < len(arrivals) and arrivals[i][0] <= self.now:
                self.post(arrivals[i][1], arrivals[i][2])
                i += 1
            self.perform(self.core.poll(self.now))


def hostile(seconds: float = 30.0) -> list[tuple[float, Tier, list[str]]]:
    paid = [(k * 0.1, Tier.PAID, [f"paid-{k}"]) for k in range(int(seconds * 10))]
    free = [(1.0 + 3.0 * k, Tier.FREE, [LONG] * 100) for k in range(int(seconds / 3))]
    return paid + free


def test_paid_stays_within_its_budget_while_free_sends_100_long_inputs_every_3_s() -> None:
    run = Run()
    run.until(40.0, hostile())
    paid = [r for r in run.requests if r.tier is Tier.PAID]
    assert all(r.answer == "200" for r in paid)
    assert max(r.latency for r in paid) <= BUDGETS[Tier.PAID]


def test_a_long_request_that_cannot_meet_its_deadline_is_refused_before_it_runs() -> None:
    run = Run()
    run.until(40.0, hostile())
    free = [r for r in run.requests if r.tier is Tier.FREE]
    assert len(free) == 10
    # The first arrives while the cost of characters is unknown, and teaches it.
    assert all(r.answer == "deadline_unreachable" for r in free[1:])
    ran = sum(1 for batch in run.sent for text in batch if text == LONG)
    assert ran < 100  # what ran of the first; none of the others' inputs ever did


def test_no_cut_holds_more_than_the_cap_save_one_long_input_alone() -> None:
    run = Run(max_batch_chars=15_000)
    run.until(10.0, [(0.0, Tier.PAID, [LONG] * 10), *[
        (0.01 * k, Tier.PAID, ["y" * 1000] * 20) for k in range(1, 5)]])
    assert all(sum(map(len, b)) <= 15_000 or len(b) == 1 for b in run.sent)
    assert all(r.answer == "200" for r in run.requests)
    assert any(len(b) == 1 and b[0] == LONG for b in run.sent)

