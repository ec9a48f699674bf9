"""The configuration a command's flags resolve, the stage they open, and what a checking stage
writes of them (its normaliser, its JUnit suite)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from calibrate import config as config_mod
from calibrate import redact
from calibrate.cli.flags import check_junit_path
from calibrate.cli.output import Output
from calibrate.config import Config
from calibrate.engines.redaction import argv_secret_values, secret_name, secret_values
from calibrate.io.baseline import VOLATILE_FIELDS, Normaliser, default_program, read_baseline
from calibrate.io.junit import JUnitSuite
from calibrate.io.store import RunDir
from calibrate.stages import env
from calibrate.stages.context import StageContext
from calibrate.stages.env import StageRequest
from calibrate.state.ledger import Ledger, baseline_path


def load_config(args: argparse.Namespace, *, base_url: str | None = None) -> Config:
    """Resolve the configuration once from file, environment and this command's flags
    (``base_url``: the target a command chose among several --base-url, else its flag).

    A command calls it once and hands the Config on (``open_stage`` takes it). Its secrets
    are remembered (``redact.remember``): from here on no file written and no line printed
    holds them, whatever a server echoes back.
    """
    if base_url is None:
        base_url = getattr(args, "base_url", None)
    for word in (base_url, *args.argv):
        url = (word or "").split("=", 1)[-1] if (word or "").startswith("-") else word
        redact.remember_url(url if url and "://" in url else None)  # before a config error
    overrides = config_mod.Overrides(
        config_path=getattr(args, "config", None),
        base_url=base_url,
        model=getattr(args, "model", None),
    )
    cfg = config_mod.load(overrides, dict(os.environ))
    remember_secrets(cfg)
    return cfg


def remember_secrets(cfg: Config) -> None:
    """The key, the metrics key, every base-URL password, the server command's secret values
    and the values of ``[server] env``'s secret-like variables (``HF_TOKEN``)."""
    redact.remember(cfg.api_key, cfg.gpu_metrics_key)
    for url in (cfg.target.base_url, *cfg.target.base_urls):
        redact.remember_url(url)
    if cfg.server.command:
        redact.remember(*secret_values(cfg.server.command))
    redact.remember(*argv_secret_values(cfg.server.args))
    redact.remember(*(value for name, value in cfg.server.env if secret_name(name)))


def open_stage(
    args: argparse.Namespace,
    stage: str,
    out: Output,
    cfg: Config | None = None,
    *,
    gate: bool = True,
    max_connections: int | None = None,
    ledger: Ledger | None = None,
    normaliser: Normaliser | None = None,
) -> StageContext:
    """The stage's request from its flags and ``cfg`` (the Config the command resolved; None:
    resolved here, after --junit is checked), then ``stages.env.open_stage``. ``normaliser``
    (--jq) is tried on the baseline first: a program that fails there is exit 2 before a run
    folder is made or a request sent, not after the first answer."""
    check_junit_path(args)
    if cfg is None:
        cfg = load_config(args)
    if normaliser is not None and baseline_path(cfg).exists():  # none: the gate says so
        normaliser.apply(read_baseline(baseline_path(cfg)))
    junit, tasks = getattr(args, "junit", None), getattr(args, "tasks", None)
    request = StageRequest(
        stage,
        cfg,
        args.argv,
        force=bool(getattr(args, "force", False)),
        gate=gate,
        junit=Path(junit) if junit else None,
        tasks=Path(tasks) if tasks else None,
        max_connections=max_connections,
        ledger=ledger,
    )
    return env.open_stage(request, out.warn)


def normaliser_for(args: argparse.Namespace) -> Normaliser:
    """--jq replaces the default program; each --ignore FIELD adds a del() after it."""
    if not args.jq:
        return Normaliser(default_program(args.ignore))
    program = args.jq
    if args.ignore:
        extra = default_program(args.ignore).split(", ", len(VOLATILE_FIELDS))[-1]
        program = f"({program}) | del({extra}"
    return Normaliser(program)


def junit_suite(stage: str, run: RunDir | None, target: str | None = None) -> JUnitSuite:
    """A suite for this stage run, with the run folder as a property."""
    props: dict[str, str] = {}
    if run is not None:
        props["run_dir"] = str(run.path)
        props["run_id"] = run.run_id
    if target:
        props["target"] = target
    return JUnitSuite(stage, props)


def save_junit(args: argparse.Namespace, suite: JUnitSuite) -> None:
    if getattr(args, "junit", None):
        suite.write(Path(args.junit))
