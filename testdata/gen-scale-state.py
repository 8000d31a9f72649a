#!/usr/bin/env python3
"""Deterministic large cluster state for benchmarks.

    testdata/gen-scale-state.py N_SERVICES N_ENDPOINTS [N_NODES] > state.json

Prints a `kubectl get services,endpointslices,nodes -A -o json`-shaped List with N_SERVICES
services in 20 namespaces, each with N_ENDPOINTS ready endpoints (one EndpointSlice per 100
endpoints, as the EndpointSlice controller caps them), spread over N_NODES nodes (default 10;
`node-1` is 192.168.77.2, as in testdata/cluster). Every 10th service is a NodePort (30000+), every
50th a LoadBalancer with an ingress IP, every 25th has ClientIP affinity, every 40th
externalTrafficPolicy Local. The same arguments always give the same bytes.

Address plan (all fictional): cluster IPs 10.96.0.0/12, pod IPs 10.64.0.0/10 (use
clusterCIDR 10.64.0.0/10 in the KubeProxyConfiguration), node IPs 192.168.77.2 + n*10,
LoadBalancer IPs 192.168.78.x.
"""

import json
import sys


def ip4(n):
    return ".".join(str((n >> s) & 255) for s in (24, 16, 8, 0))


def base(a, b, c, d):
    return (a << 24) | (b << 16) | (c << 8) | d


CLUSTER_IP_BASE = base(10, 96, 0, 0)
POD_IP_BASE = base(10, 64, 0, 0)
LB_IP_BASE = base(192, 168, 78, 0)


def meta(name, namespace=None, labels=None):
    m = {"name": name}
    if namespace is not None:
        m["namespace"] = namespace
    if labels:
        m["labels"] = labels
    return m


def service(i):
    ns = f"ns-{i % 20:02d}"
    name = f"svc-{i:05d}"
    port = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}
    spec = {
        "type": "ClusterIP",
        "clusterIP": ip4(CLUSTER_IP_BASE + 1 + i),
        "clusterIPs": [ip4(CLUSTER_IP_BASE + 1 + i)],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "ports": [port],
        "sessionAffinity": "None",
        "internalTrafficPolicy": "Cluster",
    }
    status = {"loadBalancer": {}}
    if i % 10 == 0:
        spec["type"] = "NodePort"
        port["nodePort"] = 30000 + i // 10
        spec["externalTrafficPolicy"] = "Cluster"
    if i % 50 == 0:
        spec["type"] = "LoadBalancer"
        spec["allocateLoadBalancerNodePorts"] = True
        status = {"loadBalancer": {"ingress": [{"ip": ip4(LB_IP_BASE + 1 + (i // 50) % 250), "ipMode": "VIP"}]}}
    if i % 25 == 0:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 10800}}
    if i % 40 == 0 and spec["type"] != "ClusterIP":
        spec["externalTrafficPolicy"] = "Local"
        spec["healthCheckNodePort"] = 32000 + (i // 40) % 700
    return ns, name, {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns), "spec": spec, "status": status}


def slices(i, ns, name, n_endpoints, n_nodes):
    out = []
    for first in range(0, n_endpoints, 100):
        endpoints = []
        for j in range(first, min(first + 100, n_endpoints)):
            k = i * n_endpoints + j
            endpoints.append({
                "addresses": [ip4(POD_IP_BASE + 1 + k)],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": f"node-{1 + k % n_nodes}",
            })
        out.append({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": meta(f"{name}-{first // 100:03d}", ns, {
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": name,
            }),
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        })
    return out


def node(n):
    name = f"node-{n}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta(name, None, {"kubernetes.io/hostname": name}),
        "spec": {},
        "status": {"addresses": [
            {"type": "InternalIP", "address": ip4(base(192, 168, 77, 2) + (n - 1) * 10)},
            {"type": "Hostname", "address": name},
        ]},
    }


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write(__doc__)
        return 2
    n_services, n_endpoints = int(argv[1]), int(argv[2])
    n_nodes = int(argv[3]) if len(argv) == 4 else 10
    if n_services > 100_000 or n_services * n_endpoints >= (1 << 22) - 2 or n_nodes < 1:
        sys.stderr.write("gen-scale-state: too large for the address plan\n")
        return 2
    out = sys.stdout
    out.write('{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":""},"items":[\n')
    first = True

    def emit(obj):
        nonlocal first
        out.write(("" if first else ",\n") + json.dumps(obj, separators=(",", ":")))
        first = False

    for i in range(n_services):
        ns, name, svc = service(i)
        emit(svc)
        for s in slices(i, ns, name, n_endpoints, n_nodes):
            emit(s)
    for n in range(1, n_nodes + 1):
        emit(node(n))
    out.write("\n]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
