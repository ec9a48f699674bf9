"""The server's own account of a tier or level (SPEC §6.1): its running count is its cap, and
why requests waited, in the server's words where it says them.

A real vLLM started with ``--max-num-seqs 4`` publishes no cap, but its ``/metrics`` said the
truth all along: ``vllm:num_requests_running`` peaked at 4 while ``vllm:num_requests_waiting``
held the rest. A tier where requests waited while the running count never passed k < B ran k,
not B: ``stop: cap`` at k, never kept, never recommended, never pinned. Waiting has other causes
it must not be mistaken for: a full KV cache (the engine runs fewer than its cap because the
cache holds no more), vLLM's ``deferred`` reason (a LoRA budget, a KV transfer), and prompt-list
mode, where the engine counts each prompt of the one request as a request of its own.

Pure functions of a tier's numbers, which the ladder, the sweep and the notes all ask: the cap
as the server showed it (``cap.py``), whether its KV cache was full (``kv.py``), and why its
requests waited, in words (``queue_note.py``).
"""
