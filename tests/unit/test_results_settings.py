"""Every committed result records the settings it ran with, and its documented command, parsed today,
still gives exactly those settings.

A flag added for one benchmark (``--rate-mbit``, default 1,000) was shared by another whose result
had run at 40 Mbit/s: the committed file could no longer be reproduced by its own command, and nothing
said so. Here each result's command (the Makefile's line that writes it, which must be the command the
file records) is parsed with today's parser, and the settings that gives must equal the recorded ones.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from gfaas.cli import build_parser
from gfaas.cli_bench import cli_settings, settings_of

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))

# Results that cannot be re-run on this machine kind or are kept as history, each with the reason.
EXEMPT = {
    "dataplane-gpu.json": "measured on a lent H100 before results recorded settings: re-run by make bench-gpu",
    "demo-gpu.json": "measured on a lent H100 before results recorded settings: re-run by make demo-gpu",
    "h100-calibration.json": "fitted from dataplane-gpu.json on the GPU machine (make bench-gpu)",
    "overload-before.json": "the hot path's base commit, measured before its rework: the comparison, kept as it was",
    "dataplane-ab-issue14-cpu.json": "an A/B of two old commits of the data plane: the record of that change, kept as it was",
}


def _json(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _argv(command: str) -> list[str]:
    """A command's argv without the interpreter or the venv's bin directory."""
    argv = shlex.split(command)
    if argv and re.search(r"(^|/)python3?(\.\d+)?$", argv[0]):
        argv = argv[1:]
    if argv and argv[0].endswith("/gfaas"):
        argv[0] = "gfaas"
    if argv and argv[0].endswith(".py") and "/" in argv[0]:
        argv[0] = re.sub(r"^.*?(?=(benchmarks|scripts|src)/)", "", argv[0])
    return argv


def settings_from(command: str) -> dict[str, Any]:
    """What ``command`` runs with, as today's code parses it."""
    argv = _argv(command)
    if argv[0] == "gfaas":
        return settings_of(build_parser().parse_args(argv[1:]))
    spec = importlib.util.spec_from_file_location(f"_script_{Path(argv[0]).stem}", ROOT / argv[0])
    assert spec and spec.loader, f"no script {argv[0]}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a = module.build_parser().parse_args(argv[1:])
    return dict(getattr(module, "settings", cli_settings)(a))


def makefile_commands() -> dict[str, list[str]]:
    """Result file name -> the argv of the Makefile line that writes it: the name follows ``--out``,
    ``--json``, ``--save`` or a redirection of stdout (Make variables and continued lines expanded)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^([A-Z_]+)\s*:?=\s*(.*)$", text, flags=re.M))
    variables.update({"BIN": ".venv/bin", "R": "benchmarks/results"})
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("\t"):
            continue
        line = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), m.group(0)), line.strip().lstrip("@"))
        for name in re.findall(r"(?:--out|--json|--save|>)\s*benchmarks/results/([\w.-]+\.json)", line):
            args = _argv(re.sub(r"\s*>\s*\S+\s*$", "", line))  # without a redirection of stdout
            if name not in out and args and (args[0] == "gfaas" or args[0].endswith(".py")):
                out[name] = args
    return out


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_a_result_is_reproduced_by_its_documented_command(path: Path) -> None:
    if path.name in EXEMPT:
        pytest.skip(EXEMPT[path.name])
    prov = json.loads(path.read_text())["provenance"]
    assert "settings" in prov, f"{path.name} records no settings: re-run it with its documented command"
    documented = makefile_commands().get(path.name)
    assert documented is not None, f"no Makefile line writes {path.name}: document its command there"
    assert _argv(prov["command"]) == documented, (
        f"{path.name} was made by `{prov['command']}`, but the Makefile documents `{' '.join(documented)}`")
    now = _json(settings_from(prov["command"]))
    assert now == _json(prov["settings"]), (
        f"{path.name}: its command now runs with different settings; recorded {prov['settings']}, today {now}: "
        "re-run it, or restore the defaults it ran with")


def test_the_scale_bench_runs_at_its_own_rate() -> None:
    """The case that slipped: `gfaas bench scale` with no flags runs each port at 40 Mbit/s, whatever
    other benchmarks' --rate-mbit defaults are."""
    s = settings_from("gfaas bench scale --json --out x.json")
    assert s["rate_mbit"] == 40.0 and s["nodes"] == 8 and s["requests"] == 40
    assert settings_from("gfaas bench cluster")["rate_mbit"] == 1000.0


def test_the_old_shared_default_would_have_been_caught() -> None:
    """What the shared flag did (bench scale at 1,000 Mbit/s) gives settings unlike the committed file's,
    so the comparison above fails on it."""
    committed = json.loads((ROOT / "benchmarks/results/scale-netns.json").read_text())
    recorded = committed.get("provenance", {}).get("settings") or committed["settings"]
    assert recorded["rate_mbit"] == 40.0
    assert _json(settings_from("gfaas bench scale --rate-mbit 1000")) != _json(recorded)


def test_output_flags_are_not_settings() -> None:
    """Where a result is written or how it is printed does not change what was measured."""
    a = settings_from("gfaas bench overload --json --out a.json --duration 5")
    b = settings_from("gfaas bench overload --duration 5")
    assert a == b and a["duration"] == 5.0 and "out" not in a and "json" not in a
