"""Benchmark entry points: synthetic protocol, real LLM, LongMemEval, LoCoMo, RMM baseline, utility training."""
