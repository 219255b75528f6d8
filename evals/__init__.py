"""The evaluation harness of remem-agent: run from the repository checkout (``python -m evals....``), never installed.

Subpackages, in the order data flows through them:

* :mod:`evals.harness`: the synthetic worlds (:mod:`~evals.harness.world` data model,
  :mod:`~evals.harness.families` generators), the simulated :mod:`~evals.harness.reader`, the compared
  :mod:`~evals.harness.systems` (``systems.yaml``), the one world-replay loop (:mod:`~evals.harness.replay`),
  the :mod:`~evals.harness.runner` that measures a system on a world, :mod:`~evals.harness.stats`,
  :mod:`~evals.harness.studies` and strict JSON output (:mod:`~evals.harness.jsonio`);
* :mod:`evals.bench`: the benchmark entry points (synthetic protocol, real LLM, LongMemEval, LoCoMo, the
  RMM baseline and its tuning, learned-utility training, the ranking demo) and BM25;
* :mod:`evals.analysis`: what turns results and traces into tables, plots and failure taxonomies;
* :mod:`evals.perf`: performance benchmarks (core, middleware, PostgreSQL) and what they record.

Imports go one way: ``bench``, ``analysis`` and ``perf`` use ``harness``; ``harness`` uses only
``remem_agent``; ``tests/test_import_graph.py`` checks there is no import cycle.
"""
