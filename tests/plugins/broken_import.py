"""A plugin whose import fails."""
raise ImportError("simulated missing vendor library libfoo.so")
