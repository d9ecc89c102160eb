"""A response cache on routed requests: what is keyed (keys.py), how an answer is kept and replayed
in either shape, JSON or a stream of server-sent events (answers.py), where it is kept (store.py),
its config section and its metrics. Imports only esr_settings: the ext_proc service drives it."""
