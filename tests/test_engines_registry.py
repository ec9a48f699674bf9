"""The engine registry: every kind has one complete ``Engine``, and the tables read from it agree
(a new engine is one module and one line in ``calibrate.engines.ENGINES``)."""

from __future__ import annotations

from typing import get_args

import pytest

from calibrate.engines import ENGINES, KINDS, engine, find
from calibrate.engines.base import LaunchSpec, ServerKind
from calibrate.errors import ConfigError


def test_every_kind_has_one_engine_in_the_order_help_lists_them() -> None:
    assert get_args(ServerKind) == KINDS
    assert [engine(kind).kind for kind in KINDS] == list(KINDS)
    assert find(None) is None and find("bogus") is None


def test_an_unknown_kind_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown server kind 'bogus'") as caught:
        engine("bogus")
    assert "vllm, llamacpp, sglang, lmdeploy, ollama, tgi, custom" in caught.value.render()


@pytest.mark.parametrize("found", [e for e in ENGINES if not e.templated], ids=lambda e: e.kind)
def test_a_built_in_engine_names_its_cap_and_axes_among_its_tune_flags(found) -> None:  # type: ignore[no-untyped-def]
    assert found.cap_key in found.tune_flags
    keys = [key for key, _ in found.default_axes(8)]
    assert keys and keys[0] == found.cap_key
    assert all(key in found.tune_flags for key in keys)
    assert found.memory_key is None or found.memory_key in found.tune_flags
    if found.own_flags:  # the cap flag is the builder's own: refused in [server] args
        assert found.tune_flags[found.cap_key] in found.own_flags
    else:
        assert found.args_refused


@pytest.mark.parametrize("kind", KINDS)
def test_the_builder_writes_the_cap_it_is_given(kind: ServerKind) -> None:
    found = engine(kind)
    command = "srv --port {port} --slots {batch_size}" if found.templated else ""
    built = found.build(LaunchSpec(kind, "/models/m", 8001, 6, command=command))
    words = [*built.argv, *(f"{k}={v}" for k, v in built.env)]
    assert "6" in words or f"{found.tune_flags.get(found.cap_key)}=6" in words
    assert built.health_path == found.health_path
