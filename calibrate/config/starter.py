"""The commented starter file that `calibrate init` writes (every key shows its default)."""

STARTER_TOML = """\
# calibrate.toml — written by `calibrate init`. Every key is optional; these are the defaults.
# Precedence: built-in defaults < this file < environment (CALIBRATE_BASE_URL, CALIBRATE_MODEL,
# CALIBRATE_API_KEY / OPENAI_API_KEY) < command-line flags.

[target]
base_url = "http://127.0.0.1:8000/v1"
model = "internlm-s2"              # the name the server registered (see GET /v1/models)
api_key_env = "CALIBRATE_API_KEY"  # the key itself never goes in this file
timeout_s = 600                    # per request, all of it (streams too)
connect_timeout_s = 10
max_response_mib = 64              # a larger answer is invalid_response
gpu_metrics_key_env = ""           # variable with a key for --gpu-metrics-url (none by default)
# base_urls = ["http://gpu1:8000/v1#c=8", "http://gpu2:8000/v1"]  # batch over several servers

[prompt]                           # the fixed input: do not change it between runs
text = "用一句话说明什么是定长数组。"
temperature = 0
max_tokens = 128
top_p = 1.0
seed = 0                           # all sampling params are always sent explicitly

[ladder]
batch_sizes = [1, 2, 4, 8]
rounds = 2                         # one batch at a time: a wave of N requests in flight together
max_rounds = 0                     # two tiers the rounds cannot tell apart run more, interleaved, up to this many (0: twice rounds)
mode = "wave"                      # "wave": N chat requests sent together; "prompt-list": one /v1/completions request carrying N prompts
vram_limit = 0.90                  # stop stepping up when memory pressure reaches this fraction
latency_rise = 1.25                # stop when the time per item (round wall time / items) rises by more than this factor over the previous tier
sample_interval_s = 0.05
min_round_s = 2.0                  # a round repeats waves of B until it has lasted this long (0 = one wave)
warmup_waves = 1                   # waves of the first tier sent before it, not counted

[sweep]
concurrency = [1, 2, 4, 8, 16]     # requests kept in flight; against a server calibrate does not manage, capped at the ladder's largest passing wave unless --beyond-ladder
level_s = 15                       # each run of a level lasts at least this (and ≥ 3× the previous level's p50 latency, ≥ 4×C requests)
repeats = 2                        # runs per level at least: the table shows the median and the min–max range
gain_min = 0.10                    # a level must add at least 10 % throughput over the best level below it, with its range above that one's, to count
max_repeats = 6                    # two levels whose runs cannot tell whether one adds gain_min are run again, interleaved, up to this many runs each

[workload]                         # what ladder and sweep send; their flags override each key
# source = "tasks"                 # fixed | tasks | synthetic (default: tasks or synthetic when set, else fixed)
# tasks = "tasks.jsonl"            # your job's items, built into prompts as batch builds them
# pick = "longest"                 # longest | sample (default: longest for the ladder, sample for the sweep)
# input_tokens = 2000              # synthetic prompts of this many tokens, or "512:4096" for a range
# output_tokens = 200              # answers forced to this many tokens where the engine allows it
shared_prefix = 0.0                # the fraction of each synthetic prompt all of them share
seed = 0                           # the draw of synthetic prompts and of sampled items

[slo]                              # optional latency bounds at p99; a ladder tier over one stops the ladder and is not kept
# ttft_p99_s = 0.5                 # time to first token (the ladder then streams its requests)
# tpot_p99_s = 0.05                # time per output token after the first
# e2e_p99_s = 20                   # whole request

[tune]                             # calibrate tune: the engine's own flags, searched by restarting it
# grid = ["max_num_seqs=8,16,32"]  # "KEY=V1,V2,…" per axis (default: the kind's own axes)
memory_fractions = [0.95, 0.9, 0.85, 0.8, 0.75, 0.7]  # tried high → low for the most demanding candidate
search = "refine"                  # around the best so far, within restarts and patience; or "grid": every candidate; or "halving": all at a short window, the better half at twice it, …
budget_s = 0                       # cap the whole run (checked before each start); 0 = none
restarts = 0                       # at most this many candidate restarts (the grid: the first N); 0 = none
patience = 6                       # refine: stop after this many candidates in a row without a significant gain
# concurrency = [1, 2, 4, 8]       # levels per candidate (default: [sweep] concurrency)
window = 1.0                       # each level's window as a fraction of the sweep's

[confidence]
level = 0.95                       # the level of the intervals repeated runs are reported with
conservative = false               # true: a verdict noise leaves in doubt takes the smaller setting (recorded) instead of exit 1

[determinism]
copies = 0                         # copies of the fixed prompt per ladder tier and sweep level; 0 = off, else 8–1024

[cost]                             # what the server's GPUs cost per hour, all of them together
# gpu_price_per_hour = 2.5         # adds $ per 1M output tokens to the tables (none by default)

# [server]                         # optional: lets calibrate start/stop the server itself
# kind = "vllm"                    # vllm | llamacpp | sglang | lmdeploy | ollama | tgi | custom
# model_path = "/models/internlm-s2"
# port = 8000
# command = ""                     # custom kind only; placeholders {model_path} {port} {batch_size} {concurrency}
# args = ["--tensor-parallel-size", "2"]  # your own engine flags, appended after calibrate's (not the cap or port)
# env = { CUDA_VISIBLE_DEVICES = "0", VLLM_CPU_KVCACHE_SPACE = "4" }  # the engine's environment: every managed start and the pinned script (secret-like names masked)
# ready_timeout_s = 900
# stop_timeout_s = 30

[paths]
runs = "runs"
baselines = "baselines"
scripts = "scripts"

[report]
plot = true                        # plot.png beside each ladder's and sweep's tables (needs matplotlib)
"""
