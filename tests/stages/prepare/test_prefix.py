"""The prefix cache's pure parts, in milliseconds: the engines' counters as they publish them,
an answer's own count, the finding's sentence, and what the ledger keeps of it."""

from __future__ import annotations

from pathlib import Path

from calibrate.gpu.engine_metrics import prefix_counters
from calibrate.gpu.prometheus import parse_prometheus
from calibrate.http.models import Choice, Completion, Usage
from calibrate.stages.prepare.prefix_finding import PrefixFinding, Share
from calibrate.stages.prepare.prefix_probe import answer_cached
from calibrate.state.summary_values import PrefixCacheSeen, Workload

# vLLM 0.10's exposition, trimmed: prometheus_client's _total and _created samples, two engines
VLLM = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 150.0
vllm:cache_config_info{block_size="16",enable_prefix_caching="False",engine="0"} 1.0
"""
OLD_VLLM = """\
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10.0
vllm:gpu_prefix_cache_hits_total{model_name="m"} 4.0
vllm:cache_config_info{block_size="16",enable_prefix_caching="None"} 1.0
"""
SGLANG = """\
sglang_prompt_tokens_total{model_name="m"} 300.0
sglang_cached_tokens_total{model_name="m"} 120.0
sglang_cache_hit_rate{model_name="m"} 0.4
"""


def test_counters_are_summed_over_engines_and_the_switch_read_from_the_info_gauge() -> None:
    found = prefix_counters(parse_prometheus(VLLM))
    assert found is not None
    assert (found.hits, found.queries, found.enabled) == (750.0, 1500.0, False)
    assert found.cache == "vLLM's automatic prefix caching"
    assert "--enable-prefix-caching" in found.switch


def test_older_vllm_names_and_newer_sglang_names_are_read_too() -> None:
    old = prefix_counters(parse_prometheus(OLD_VLLM))
    assert old is not None and (old.hits, old.queries, old.enabled) == (4.0, 10.0, None)
    assert old.metric == "vllm:gpu_prefix_cache_hits_total"
    sglang = prefix_counters(parse_prometheus(SGLANG))
    assert sglang is not None and sglang.cache == "SGLang's radix cache"
    assert (sglang.hits, sglang.queries) == (120.0, 300.0)
    assert prefix_counters(parse_prometheus("llamacpp:requests_processing 1\n")) is None


def _answer(body: dict[str, object]) -> Completion:
    return Completion((Choice(0, "x", "length"),), Usage(100, 1, 101), "m", None, 0.1, body=body)


def test_an_answers_own_count_llamacpp_or_openai() -> None:
    assert answer_cached(_answer({"timings": {"cache_n": 64, "prompt_n": 36}})) == (
        64,
        "timings.cache_n",
    )
    openai = {"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 80}}}
    assert answer_cached(_answer(openai)) == (80, "usage.prompt_tokens_details.cached_tokens")
    assert answer_cached(_answer({"timings": {"cache_n": -1}})) is None
    assert answer_cached(_answer({})) is None


def _finding(hit: float | None, seconds: float, enabled: bool | None = True) -> PrefixFinding:
    return PrefixFinding(
        "vLLM's automatic prefix caching",
        enabled,
        "vllm serve … --enable-prefix-caching",
        Share(seconds, hit, "vllm:prefix_cache_hits_total" if hit is not None else None),
        Share(0.5, 0.0 if hit is not None else None, None),
    )


def test_the_sentence_says_on_off_and_the_gain_or_its_absence() -> None:
    on = _finding(0.8, 0.1)
    assert on.gain == 5.0 and on.state == "on"
    assert "is on: 80% of the shared-prefix prompts' tokens came from it" in on.sentence()
    assert on.sentence().endswith("5.0× sooner")
    off = _finding(0.0, 0.5, enabled=False)
    assert "is off on this server" in off.sentence()
    assert off.sentence().endswith("vllm serve … --enable-prefix-caching")
    assert "sooner" not in off.sentence()
    silent = PrefixFinding(None, None, "", Share(0.1, None, None), Share(0.5, None, None))
    assert "publishes no hit count" in silent.sentence()
    assert "(a prefix cache at work)" in silent.sentence()
    flat = PrefixFinding(None, None, "", Share(0.5, None, None), Share(0.52, None, None))
    assert "(no prefix cache at work)" in flat.sentence()
    assert PrefixFinding.unmeasured(None, "the probe failed: 500").gain is None


def test_the_ledger_keeps_the_cache_and_says_it_where_the_workload_is_named() -> None:
    seen = PrefixCacheSeen("vLLM's automatic prefix caching", True, 0.74, 3.3)
    workload = Workload("synthetic", 2000, 20, "2000", prefix_tokens=1500, prefix_cache=seen)
    again = Workload.from_json(workload.to_json())
    assert again == workload
    text = again.describe()
    assert "the first 1500 tokens shared" in text
    assert "prefix cache on (vLLM's automatic prefix caching): 74% of prompt tokens" in text
    assert "3.3× sooner" in text
    # a cache that found nothing in a workload that shares nothing is not said
    quiet = Workload("synthetic", prefix_cache=PrefixCacheSeen("x", True, 0.0, None))
    assert "prefix cache" not in quiet.describe()
    replayed = Workload("replay", replay=str(Path("out.jsonl")), replay_items=840)
    assert replayed.describe().startswith("replay of out.jsonl (its own token counts, 840 items)")
