//! The only place that builds Kubernetes API clients (from kubectl-style flags).
