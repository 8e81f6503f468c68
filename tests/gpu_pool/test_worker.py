"""The worker: one batch held to the contract, the model loaded once, the READY handshake.

`worker_main` runs here in the test's own main thread (it ignores SIGINT, which only the
main thread may do), over a real pipe whose other end the test holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from gpu_pool import (
    BatchId,
    BatchModel,
    Err,
    Ok,
    Ready,
    Run,
    Stop,
    WorkerConfig,
    load_worker,
    run_batch,
)
from gpu_pool.worker import worker_main
from tests.gpu_pool.test_pool import running_pool
from tests.models import bad_message, exits, interrupts, poison, short_by_one

SIM = WorkerConfig(model="sim", gpu=None, threads=1, latency_floor=0.0)
SAFETY_S = 30.0  # only if a worker never returns: the test then fails instead of hanging


class FakeTime:
    """A clock and a sleep that moves it: padding costs no real time."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def reverse(inputs: list[str]) -> list[str]:
    return [s[::-1] for s in inputs]


def returning(outputs: object) -> BatchModel:
    """A model answering `outputs` whatever it is given, as a careless user's function may."""

    def model(inputs: list[str]) -> list[str]:
        return outputs  # type: ignore[return-value]

    return model


# -- run_batch -------------------------------------------------------------------------------
def test_outputs_come_back_one_per_input_in_order() -> None:
    reply = run_batch(reverse, Run(BatchId(1), ("abc", "de", "")), floor=0.0)
    assert isinstance(reply, Ok)
    assert (reply.batch_id, reply.outputs) == (BatchId(1), ("cba", "ed", ""))


def test_a_tuple_of_outputs_is_accepted() -> None:
    reply = run_batch(returning(("b",)), Run(BatchId(1), ("a",)), floor=0.0)
    assert isinstance(reply, Ok) and reply.outputs == ("b",)


def test_a_model_that_raises_gives_an_error_not_a_crash() -> None:
    reply = run_batch(poison, Run(BatchId(2), ("ok", "POISON")), floor=0.0)
    assert reply == Err(BatchId(2), "model", "ValueError", "cannot handle 'POISON'")


def test_a_long_error_message_is_cut_short() -> None:
    def loud(inputs: list[str]) -> list[str]:
        raise RuntimeError("x" * 10_000)

    reply = run_batch(loud, Run(BatchId(1), ("a",)), floor=0.0)
    assert isinstance(reply, Err) and len(reply.message) == 500


def test_too_few_outputs_break_the_contract() -> None:
    reply = run_batch(short_by_one, Run(BatchId(3), ("a", "b")), floor=0.0)
    assert reply == Err(BatchId(3), "contract", "ContractViolation", "1 outputs for 2 inputs")


def test_too_many_outputs_break_the_contract() -> None:
    reply = run_batch(returning(["a", "a"]), Run(BatchId(3), ("a",)), floor=0.0)
    assert isinstance(reply, Err) and reply.kind == "contract"


@pytest.mark.parametrize("outputs", [[1], [b"a"], [None], "a", None, {"a": "b"}])
def test_outputs_that_are_not_a_list_of_strings_break_the_contract(outputs: object) -> None:
    reply = run_batch(returning(outputs), Run(BatchId(4), ("a",)), floor=0.0)
    assert reply == Err(BatchId(4), "contract", "ContractViolation", "outputs must be strings")


def test_a_str_subclass_is_not_a_string_for_the_contract() -> None:
    class Label(str):
        pass

    reply = run_batch(returning([Label("a")]), Run(BatchId(5), ("a",)), floor=0.0)
    assert isinstance(reply, Err) and reply.kind == "contract"


def test_a_quick_batch_is_padded_to_the_floor() -> None:
    t = FakeTime()

    def takes_30ms(inputs: list[str]) -> list[str]:
        t.now += 0.030
        return inputs

    reply = run_batch(takes_30ms, Run(BatchId(1), ("a",)), 0.100, clock=t.clock, sleep=t.sleep)
    assert t.slept == [pytest.approx(0.070)]
    assert isinstance(reply, Ok) and reply.seconds == pytest.approx(0.100)


def test_a_batch_slower_than_the_floor_is_not_padded() -> None:
    t = FakeTime()

    def takes_200ms(inputs: list[str]) -> list[str]:
        t.now += 0.200
        return inputs

    reply = run_batch(takes_200ms, Run(BatchId(1), ("a",)), 0.100, clock=t.clock, sleep=t.sleep)
    assert t.slept == []
    assert isinstance(reply, Ok) and reply.seconds == pytest.approx(0.200)


def test_an_error_is_answered_at_once_without_padding() -> None:
    t = FakeTime()
    run_batch(poison, Run(BatchId(1), ("POISON",)), 0.100, clock=t.clock, sleep=t.sleep)
    assert t.slept == []


@pytest.mark.parametrize(("model", "text", "error_type"), [
    (exits, "EXIT", "SystemExit"), (interrupts, "INTERRUPT", "KeyboardInterrupt")])
def test_a_model_that_exits_or_interrupts_gives_an_error_not_a_crash(
    model: BatchModel, text: str, error_type: str,
) -> None:
    reply = run_batch(model, Run(BatchId(1), ("ok", text)), floor=0.0)
    assert isinstance(reply, Err) and (reply.kind, reply.error_type) == ("model", error_type)


def test_an_error_that_cannot_say_what_it_is_is_still_answered() -> None:
    reply = run_batch(bad_message, Run(BatchId(1), ("BAD",)), floor=0.0)
    assert reply == Err(BatchId(1), "model", "_Unprintable", "(the error's message failed)")


# -- load_worker -----------------------------------------------------------------------------
@pytest.fixture
def hub_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The variables load_worker sets, restored after the test whatever it sets."""
    for name in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.setenv(name, "restored")
        monkeypatch.delenv(name)
    return monkeypatch


def test_the_sim_model_loads_on_the_cpu(hub_env: pytest.MonkeyPatch) -> None:
    model, device = load_worker(SIM)
    assert device == "cpu" and model(["ab"]) == ["ba"]


def test_loading_keeps_the_hub_offline_unless_told_otherwise(
    hub_env: pytest.MonkeyPatch,
) -> None:
    hub_env.setenv("TOKENIZERS_PARALLELISM", "true")
    load_worker(SIM)
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TOKENIZERS_PARALLELISM"] == "true"


def loaded_in_a_fresh_process(spec: str, threads: int = 1, path: str = "") -> list[str]:
    """Load `spec` as a worker does, in a new interpreter (so nothing imported here counts):
    the device, whether torch was imported, and torch's threads ('None' without torch)."""
    code = ("import sys; from gpu_pool.worker import WorkerConfig, load_worker; "
            f"_, device = load_worker(WorkerConfig({spec!r}, gpu=0, threads={threads}, "
            "latency_floor=0.0)); torch = sys.modules.get('torch'); "
            "print(device, torch is not None, torch and torch.get_num_threads())")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [path, os.getcwd()]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    return out.stdout.split()


def test_a_worker_for_a_model_without_a_gpu_never_imports_torch() -> None:
    assert loaded_in_a_fresh_process("sim") == ["cpu", "False", "None"]


def test_a_users_function_without_torch_starts_without_it() -> None:
    """A user's model is assumed to want a GPU, yet torch is its own import: a function that
    never asks for it leaves the worker light (a start without torch's second of CPU)."""
    assert loaded_in_a_fresh_process("tests.models:counting") == ["cpu", "False", "None"]


def test_a_users_function_that_imports_torch_gets_its_threads_split(tmp_path: Path) -> None:
    """Torch brought in by the user's module still gets the worker's share of the cores and
    its device (the CPU here: no GPU is visible)."""
    (tmp_path / "uses_torch.py").write_text(
        "import torch\n\ndef double(inputs):\n    return [s * 2 for s in inputs]\n")
    got = loaded_in_a_fresh_process("uses_torch:double", threads=1, path=str(tmp_path))
    assert got == ["cpu", "True", "1"]


def test_a_built_in_spec_with_choices_loads_on_the_workers_device(
    hub_env: pytest.MonkeyPatch,
) -> None:
    """`minilm-guard:weapons` is the built-in guard, not a user's function loaded on the CPU:
    a worker given a GPU hands its loader that device and the choices."""
    import gpu_pool.models.minilm_guard
    import gpu_pool.worker

    calls: list[tuple[str, ...]] = []

    def load(*args: str) -> object:
        calls.append(args)
        return poison

    hub_env.setattr(gpu_pool.models.minilm_guard, "load", load)
    hub_env.setattr(gpu_pool.worker, "_torch_device", lambda config: "cuda")
    config = WorkerConfig(model="minilm-guard:weapons", gpu=0, threads=1, latency_floor=0.0)
    assert load_worker(config) == (poison, "cuda")
    assert calls == [("cuda", "weapons")]


# -- worker_main: the handshake --------------------------------------------------------------
@pytest.fixture
def pipe(hub_env: pytest.MonkeyPatch) -> Iterator[tuple[Connection, Connection]]:
    """Both ends of a real pipe; SIGINT's handler, which the worker ignores, put back after."""
    previous = signal.getsignal(signal.SIGINT)
    parent, child = Pipe()
    safety = threading.Timer(SAFETY_S, parent.close)  # EOF ends a worker that never returns
    safety.start()
    try:
        yield parent, child
    finally:
        safety.cancel()
        signal.signal(signal.SIGINT, previous)
        parent.close()
        child.close()


def test_the_worker_says_ready_then_answers_each_run_until_stop(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    for message in (Run(BatchId(1), ("ab",)), Run(BatchId(2), ("cd", "e")), Stop()):
        parent.send(message)
    worker_main(child, SIM)
    ready, first, second = (parent.recv() for _ in range(3))
    assert isinstance(ready, Ready) and ready.device == "cpu"
    assert [(r.batch_id, r.outputs) for r in (first, second)] == [
        (BatchId(1), ("ba",)), (BatchId(2), ("dc", "e"))]
    assert not parent.poll()  # nothing after Stop


def test_the_worker_leaves_when_the_parent_is_gone(pipe: tuple[Connection, Connection]) -> None:
    parent, child = pipe

    def parent_reads_ready_and_leaves() -> None:
        parent.poll(SAFETY_S)
        got.append(parent.recv())
        parent.close()

    got: list[object] = []
    leaving = threading.Thread(target=parent_reads_ready_and_leaves)
    leaving.start()
    worker_main(child, SIM)  # returns on EOF
    leaving.join(SAFETY_S)
    assert len(got) == 1 and isinstance(got[0], Ready)


def test_the_worker_ignores_sigint_so_the_parent_decides_shutdown(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    parent.send(Stop())
    worker_main(child, SIM)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


# -- a real worker process -------------------------------------------------------------------
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize(("model", "text"), [
    ("exits", "EXIT"), ("interrupts", "INTERRUPT"), ("bad_message", "BAD")])
async def test_a_worker_process_answers_a_model_that_exits_and_lives(
    model: str, text: str,
) -> None:
    async with running_pool(f"tests.models:{model}") as (pool, events):
        w = events.ready[0]
        pool.send(w, Run(BatchId(1), (text,)))
        await events.wait_for(lambda: events.replies or events.died)
        assert events.died == []
        pool.send(w, Run(BatchId(2), ("ok",)))
        await events.wait_for(lambda: len(events.replies) == 2 or events.died)
        assert events.died == []
        first, second = (reply for _, reply in events.replies)
        assert isinstance(first, Err) and first.kind == "model"
        assert second == Ok(BatchId(2), ("ko",), second.seconds)  # type: ignore[union-attr]
