"""The online routing decision: the config schema, the classifiers, the routing engine and its cache, the metrics."""
