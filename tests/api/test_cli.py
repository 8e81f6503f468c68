import signal
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli import build_parser, main, refuse_public_demo_keys, settings_from
from api.config import Settings, Workers
from api.door import hang_settings, latency_floor

BATCHGATE = str(Path(sys.executable).parent / "batchgate")  # the installed console script


def settings(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return settings_from(build_parser(env or {}).parse_args(["serve", *argv]))


def test_defaults_are_the_documented_ones() -> None:
    s = settings([])
    assert (s.host, s.port, s.model, s.max_batch, s.max_wait_ms) == (
        "127.0.0.1", 8000, "minilm", 100, 50.0)
    hang = hang_settings(s)
    assert latency_floor(s) == 0.0 and hang.kill_after is None  # learned
    assert hang.hedge and hang.hedge_floor == 0.5


def test_sim_pads_batches_to_100_ms() -> None:
    assert latency_floor(settings(["--model", "sim"])) == 0.1
    assert latency_floor(settings(["--model", "sim", "--batch-latency-ms", "20"])) == 0.02


def test_environment_variables_set_flags_and_flags_win() -> None:
    s = settings(["--workers", "3"], {"BATCHGATE_WORKERS": "7", "BATCHGATE_MAX_WAIT_MS": "20"})
    assert s.workers == Workers(3) and s.max_wait_ms == 20.0


@pytest.mark.parametrize(
    "argv",
    [["--max-batch", "101"], ["--workers", "0"], ["--port", "x"], ["--model", "no good"],
     ["--gpus", "-1"], ["--access-log", "xml"], ["--gateways", "many"],
     ["--keys", "/nonexistent.toml"], ["--idle-trigger", "maybe"], ["--pool", "gpu"],
     ["--ray-worker-resources", "GPU=0"]],
)
def test_a_bad_value_is_one_line_and_exit_2(argv: list[str]) -> None:
    proc = subprocess.run(
        [BATCHGATE, "serve", *argv], capture_output=True, text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("batchgate")
    assert "error:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_public_demo_keys_are_served_on_loopback_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = Path(__file__).parents[2] / "examples" / "keys.toml"
    assert main(["serve", "--keys", str(demo), "--host", "0.0.0.0", "--model", "sim"]) == 2
    assert "public demo keys" in capsys.readouterr().err
    refuse_public_demo_keys(Settings(host="127.0.0.1", keys=demo))  # loopback: fine
    own = tmp_path / "keys.toml"
    own.write_text('[[keys]]\nkey = "a-real-secret"\ntier = "paid"\n')
    refuse_public_demo_keys(Settings(host="0.0.0.0", keys=own))  # its own keys: fine


def test_pool_ray_without_ray_installed_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what find_spec sees without Ray
    assert main(["serve", "--pool", "ray", "--model", "sim"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'batchgate[ray]'" in err


def test_ray_address_defaults_to_rays_own_variable() -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")
    from api.cli import with_ray

    env = {"RAY_ADDRESS": "head-node:6379"}
    assert with_ray(settings(["--pool", "ray"]), env).ray_address == "head-node:6379"
    given = settings(["--pool", "ray", "--ray-address", "other:6379"])
    assert with_ray(given, env).ray_address == "other:6379"
    assert with_ray(settings([]), env).ray_address is None  # the process pool ignores it


def test_gpus_are_asked_of_torch_only_when_not_given() -> None:
    from api.cli import with_gpus

    assert with_gpus(settings(["--gpus", "2"])).gpus == 2
    assert with_gpus(settings(["--model", "sim"])).gpus == 0  # sim needs no GPU
    assert with_gpus(settings(["--pool", "ray"])).gpus == 0  # actors find their own


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_more_while_a_stopped_server_exits_leaves_its_status(name: str) -> None:
    """Once a stop by a signal is said, the process ends with 128 + the signal, even if
    the signal comes again on its way out (it died of SIGINT after the line, now and then)."""
    script = ("import signal, sys\nfrom api.cli import interrupted\n"
              f"code = interrupted(signal.{name})\nsignal.raise_signal(signal.{name})\n"
              "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (128 + getattr(signal, name),
                                              f"batchgate: stopped by {name}\n")


LOST_CTRL_C = """
import os, signal, sys, weakref
import api.door
from loadtest.server import free_port


def build(settings, identity=None):  # the server's build, where Ctrl-C lands in a callback
    class Thing:
        pass

    def landed(_):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):  # the handler runs in here, inside the weakref callback
            pass

    thing = Thing()
    ref = weakref.ref(thing, landed)
    del thing
    print("the start went on", flush=True)
    return None


api.door.build = build
from api.cli import main
sys.exit(main(["serve", "--model", "sim", "--port", str(free_port())]))
"""


def test_ctrl_c_before_the_server_runs_is_never_lost_in_a_callback() -> None:
    """Python ignores a KeyboardInterrupt raised in a weakref callback or a finalizer (it
    prints 'Exception ignored'): the start then went on to serve, and the start-up's Ctrl-C
    test waited a minute for it. Before a server takes Ctrl-C over, it stops the process."""
    done = subprocess.run([sys.executable, "-c", LOST_CTRL_C], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=60)
    assert "the start went on" not in done.stdout, done.stderr
    assert (done.returncode, done.stderr.strip().splitlines()[-1]) == (
        128 + signal.SIGINT, "batchgate: stopped by SIGINT"), done.stderr


TWO_CTRL_C = """
import os, signal, sys
import api.cli


class Pressed:  # a second Ctrl-C lands while the first one's line is written
    def __init__(self, out):
        self.out, self.pressed = out, False

    def write(self, text):
        written = self.out.write(text)
        if not self.pressed:
            self.pressed = True
            self.out.flush()
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100_000):  # a handler of it would run in here
                pass
        return written

    def flush(self):
        self.out.flush()


sys.stderr = Pressed(sys.stderr)
signal.signal(signal.SIGINT, api.cli.stop_now)
os.kill(os.getpid(), signal.SIGINT)
for _ in range(100_000):
    pass
print("not stopped", flush=True)
"""


def test_a_second_ctrl_c_while_the_first_stops_the_start_writes_nothing_more() -> None:
    """Two Ctrl-C at once (the start-up's test sends two) wrote the line twice, the second
    into the middle of the first: 'stopped by SIGINTbatchgate: stopped by SIGINT'."""
    done = subprocess.run([sys.executable, "-c", TWO_CTRL_C], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=60)
    assert "not stopped" not in done.stdout, done.stderr
    assert (done.returncode, done.stderr) == (
        128 + signal.SIGINT, "batchgate: stopped by SIGINT\n"), done.stderr


CTRL_C_WHILE_IMPORTING = """
import os, signal, sys


class Pressed:  # Ctrl-C while the server's modules are imported
    def find_spec(self, name, path=None, target=None):
        if name == "api.config":
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100_000):  # a handler of it would run in here
                pass
        return None


sys.meta_path.insert(0, Pressed())
from api.__main__ import main

sys.argv = ["batchgate", "serve", "--model", "sim", "--port", "1"]
sys.exit(main())
"""


def test_ctrl_c_while_the_command_line_imports_the_server_is_its_line() -> None:
    """The entry takes Ctrl-C over before the server's modules load (~0.1 s of imports):
    before, Python's KeyboardInterrupt printed a traceback from inside an import."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_IMPORTING],
                          cwd=Path(__file__).parents[2], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr) == (
        128 + signal.SIGINT, "batchgate: stopped by SIGINT\n"), done.stderr
