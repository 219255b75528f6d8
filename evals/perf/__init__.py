"""Performance benchmarks (core, middleware, PostgreSQL) and the machine facts they record."""
