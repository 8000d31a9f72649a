//! The service graph rebuilt from a ruleset: entries, chains, endpoints with shares, anomalies.
