"""Synthetic worlds, the simulated reader, the compared systems, replay, runner, statistics and studies."""
