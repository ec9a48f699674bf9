"""The job formats batch reads and answers in: the OpenAI Batch API's request and output lines
(``openai_batch``) beside calibrate's own ``{id, text}`` tasks (io/tasks.py), and the shards a
job is split into for a cluster scheduler (``shard``)."""
