//! Node collectors: the only place that reads a node's rules (files, local commands, pod exec, debug pod, bundle).
