"""sockherd.worker: worker bootstrap, thread groups, per-thread event loop,
connection API and app adapters."""
