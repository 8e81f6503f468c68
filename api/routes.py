"""HTTP handlers. Each validates, hands items to the batcher and awaits their answers; none
ever touches a worker."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict

import anyio
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from api.auth import KeyRing, Principal
from api.errors import ApiError, error_response, retry_after, to_api_error
from api.fastpath import HttpCall, JsonAnswer
from api.limits import RateLimiter, pressure_factor
from api.metrics import Metrics
from api.requests import Limits, PendingRequest, parse_body, parse_timeout
from api.service import Service
from batcher import DeadlineExceeded, Item
from failover import LEADER_GONE, Join, Lead, Replay, StoredResponse

JSON = "application/json"
MAX_IDEMPOTENCY_KEY = 255


class Routes:
    def __init__(self, service: Service, keys: KeyRing, metrics: Metrics) -> None:
        self.service = service
        self.keys = keys
        self.metrics = metrics
        s = service.settings
        self.limits = Limits(s.max_inputs, s.max_input_chars, s.max_body_bytes, s.model)
        self.rate_limiter = RateLimiter(keys.tiers)

    async def batchstring(self, request: HttpCall) -> Response:
        started = time.perf_counter()
        tier = "unknown"
        try:
            principal = self.keys.identify(request.headers.get("authorization"))
            tier = principal.tier.label
            key = request.headers.get("idempotency-key")
            if key is None:
                response = await self._serve(request, principal)
            else:
                response = await self._idempotent(request, principal, key)
        except Exception as exc:  # translated at the boundary, never a traceback
            response = self._error(exc, tier)
        elapsed = time.perf_counter() - started
        if "server-timing" not in response.headers:  # errors and replays: the total only
            response.headers["Server-Timing"] = f"total;dur={elapsed * 1000:.1f}"
        self.metrics.request_done(tier, response.status_code, elapsed)
        return response

    def _error(self, exc: BaseException, tier: str) -> Response:
        err = to_api_error(exc)
        if err.status in (429, 503):
            self.metrics.rejected.labels(tier, err.code).inc()
        return error_response(err.status, err.code, err.message, err.headers)

    async def _idempotent(self, request: HttpCall, principal: Principal, key: str) -> Response:
        """Run a keyed request once per account: join it in flight, or replay its answer."""
        if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
            raise ApiError(400, "invalid_idempotency_key",
                           f"Idempotency-Key must be 1..{MAX_IDEMPOTENCY_KEY} characters")
        body = await _read_body(request, self.limits.max_body_bytes)
        store, clock = self.service.idempotency, self.service.clock
        scope = principal.account if principal.key else ""  # anonymous: a scope of its own
        begin = store.begin(scope, key, hashlib.sha256(body).digest(), clock.now())
        if isinstance(begin, Replay):
            self.metrics.replays.inc()
            return _stored(begin.response)
        if isinstance(begin, Join):
            with anyio.move_on_after(self._timeout(request, principal)):
                stored = await begin.entry.wait()
                if stored is LEADER_GONE:
                    raise ApiError(503, "retry", "the original request did not finish",
                                   retry_after(1))
                self.metrics.replays.inc()
                return _stored(stored)
            raise DeadlineExceeded("the original request is still running")
        assert isinstance(begin, Lead)
        try:
            try:
                response = await self._serve(request, principal, body)
            except Exception as exc:
                response = self._error(exc, principal.tier.label)
            store.complete(begin.entry, StoredResponse(response.status_code, bytes(response.body)),
                           clock.now())
            return response
        finally:
            store.abandon(begin.entry, clock.now())  # a no-op once completed

    def _timeout(self, request: HttpCall, principal: Principal) -> float:
        return parse_timeout(
            request.headers.get("x-request-timeout-ms"),
            self.keys.tiers[principal.tier].timeout_ms / 1000,
            self.service.settings.max_request_timeout_ms / 1000,
        )

    async def _serve(
        self, request: HttpCall, principal: Principal, body: bytes | None = None
    ) -> Response:
        service = self.service
        now = service.clock.now()
        factor = pressure_factor(service.pressure(principal.tier))
        self.rate_limiter.check(principal, now, factor)
        if body is None:
            body = await _read_body(request, self.limits.max_body_bytes)
        parsed = parse_body(body, self.limits)
        timeout = self._timeout(request, principal)
        pending = PendingRequest(len(parsed.texts))
        items = service.new_items(parsed.texts, principal.tier, now, timeout, pending)
        service.core.admit(items, timeout)
        try:
            await pending.wait(timeout, request.receive)
        finally:
            if pending.remaining:  # not all answered: never run what is left
                for item in items:
                    service.core.cancel(item)
        if pending.client_left:
            raise ClientDisconnect()
        if pending.error is not None:
            raise pending.error
        if pending.timed_out:
            raise DeadlineExceeded("the request's deadline passed before it was answered")
        return self._answer(parsed.single, pending, items, principal)

    def _answer(
        self, single: bool, pending: PendingRequest, items: list[Item], principal: Principal
    ) -> Response:
        rid = os.urandom(8).hex()
        payload = (
            {"id": rid, "output": pending.outputs[0]}
            if single
            else {"id": rid, "outputs": pending.outputs}
        )
        queue = max(i.dispatched - i.arrived for i in items)
        tier = principal.tier.label
        for item in items:
            self.metrics.queue_waited(tier, item.dispatched - item.arrived)
        batch = self.service.clock.now() - min(i.dispatched for i in items)
        timing = f"queue;dur={queue * 1000:.1f}, batch;dur={batch * 1000:.1f}"
        return JsonAnswer(orjson.dumps(payload), timing)

    async def healthz(self, request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def readyz(self, request: Request) -> Response:
        ready = self.service.ready()
        body = {"ready": ready, "workers_ready": self.service.pool.ready_count(),
                "draining": self.service.draining}
        return Response(orjson.dumps(body), status_code=200 if ready else 503, media_type=JSON)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def admin_workers(self, request: Request) -> Response:
        if not self.keys.is_admin(request.headers.get("authorization")):
            return error_response(401, "unauthorized", "an admin key is required")
        workers = [asdict(w) for w in self.service.workers()]
        return Response(orjson.dumps({"workers": workers}), media_type=JSON)


def _stored(stored: StoredResponse) -> Response:
    return Response(stored.body, status_code=stored.status, media_type=JSON,
                    headers={"Idempotent-Replayed": "true"})


async def _read_body(request: HttpCall, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body_too_large", f"the body is limited to {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body_too_large", f"the body is limited to {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


__all__ = ["Routes"]
