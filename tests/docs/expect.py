"""What a run example must print to match its page.

A transcript shows each command after `$ ` and what it printed. What changes from run to run
is not compared: an answer's `id`, the `date`, `content-length` and `server-timing` headers'
values; and where the test serves another model than the page's (`sim` for `minilm`, to
start in a second), the outputs are compared by their shape only. Everything else must be as
shown: the keys of every JSON answer, the `model` that ran it, the status line, the headers'
names, and any other line of text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

VARYING_HEADERS = {"date", "content-length", "server-timing"}
OUTPUT_KEYS = {"output", "outputs"}


@dataclass(frozen=True, slots=True)
class Step:
    command: str
    shown: str  # what the page shows it printed


def steps(transcript: str) -> list[Step]:
    """The `$ ` commands of a transcript (continued over lines ending in a backslash), each
    with the lines after it up to the next command, its trailing blank lines dropped."""
    out: list[Step] = []
    lines = transcript.splitlines()
    i = 0
    while i < len(lines):
        assert lines[i].startswith("$ "), f"a transcript line that is no command: {lines[i]!r}"
        command = [lines[i][2:]]
        while command[-1].endswith("\\"):
            i += 1
            command.append(lines[i])
        i += 1
        shown = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        out.append(Step("\n".join(command), "\n".join(shown).rstrip()))
    return out


def json_differences(shown: object, got: object, exact_outputs: bool, at: str = "") -> list[str]:
    if isinstance(shown, dict) and isinstance(got, dict):
        if set(shown) != set(got):
            return [f"{at or 'answer'}: keys {sorted(got)}, the page shows {sorted(shown)}"]
        out = []
        for key, value in shown.items():
            if key == "id":
                if not re.fullmatch(r"[0-9a-f]{16}", str(got[key])):
                    out.append(f"{at}.id: {got[key]!r} is no answer id")
            elif key in OUTPUT_KEYS and not exact_outputs:
                if type(value) is not type(got[key]) or (
                        isinstance(value, list) and len(value) != len(got[key])):
                    out.append(f"{at}.{key}: {got[key]!r}, the page shows {value!r}")
            else:
                out += json_differences(value, got[key], exact_outputs, f"{at}.{key}")
        return out
    return [] if shown == got else [f"{at or 'answer'}: {got!r}, the page shows {shown!r}"]


def _http_differences(shown: str, got: str, exact_outputs: bool) -> list[str]:
    shown_head, _, shown_body = shown.partition("\n\n")
    got_head, _, got_body = got.replace("\r\n", "\n").partition("\n\n")
    (shown_status, *shown_fields), (got_status, *got_fields) = (
        shown_head.splitlines(), got_head.splitlines())
    out = [] if shown_status == got_status else [f"status {got_status!r}, shown {shown_status!r}"]
    shown_headers = dict(f.lower().split(": ", 1) for f in shown_fields)
    got_headers = dict(f.lower().split(": ", 1) for f in got_fields)
    if set(shown_headers) != set(got_headers):
        out.append(f"headers {sorted(got_headers)}, the page shows {sorted(shown_headers)}")
    out += [f"{name}: {got_headers[name]!r}, the page shows {value!r}"
            for name, value in shown_headers.items()
            if name in got_headers and name not in VARYING_HEADERS and got_headers[name] != value]
    return out + differences(shown_body, got_body, exact_outputs)


def differences(shown: str, got: str, exact_outputs: bool) -> list[str]:
    """How `got` (what a command printed) departs from what the page `shown`; [] if not."""
    if shown.startswith("HTTP/"):
        return _http_differences(shown, got, exact_outputs)
    try:
        shown_json = json.loads(shown)
    except ValueError:
        got_lines = [line.rstrip() for line in got.rstrip().splitlines()]
        same = got_lines == shown.splitlines()
        return [] if same else [f"printed:\n{got}\nthe page shows:\n{shown}"]
    try:
        return json_differences(shown_json, json.loads(got), exact_outputs)
    except ValueError:
        return [f"printed no JSON:\n{got}"]


def json_values(text: str) -> list[object]:
    """The JSON values printed one after another (curl's answers end in no newline)."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while (i := i + len(text[i:]) - len(text[i:].lstrip())) < len(text):
        value, i = decoder.raw_decode(text, i)
        values.append(value)
    return values


def printed_as_commented(script: str, printed: str, exact_outputs: bool) -> list[str]:
    """A script's `print(...)  # WHAT` lines: each WHAT must be printed, in their order;
    without exact outputs the quoted strings of both sides are left out."""
    def seen(line: str) -> str:
        return line if exact_outputs else re.sub(r"'[^']*'", "'…'", line)

    wanted = [seen(m[1].strip()) for m in re.finditer(r"print\(.*\)\s+# (.*)$", script, re.M)]
    lines = iter(seen(line.rstrip()) for line in printed.splitlines())
    missing = [w for w in wanted if not any(line == w for line in lines)]
    return [f"not printed in order: {missing}\nprinted:\n{printed}"] if missing else []
