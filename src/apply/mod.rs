//! Repair plans (per-chain diff → restore input), backup/rollback, and the resync loop.
