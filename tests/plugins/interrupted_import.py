"""A plugin whose import is interrupted (Ctrl-C, a time limit's SIGINT) — not a broken plugin."""
raise KeyboardInterrupt
