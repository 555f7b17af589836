"""Reference implementations of every op: pure torch, float64 math, one module per op family."""
