//! kube-proxy emulation: from cluster state to the rules kube-proxy would install. Never reads files or the API.
