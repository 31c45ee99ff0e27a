"""Pure logic on models: planning and seeds, the SLA judge, outcome policy, aggregation,
estimators and sweeps. No I/O."""
