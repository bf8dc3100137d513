#!/usr/bin/env python3
"""A stand-in for a node's control socket: answers {"cmd":"status"} with a status of
N members (the shape of `weft status --json`, counters growing with time) and every
other request with an error. For bench/web/cost.sh only.

    fake_node.py SOCKET N
"""
import json
import os
import socket
import sys
import threading
import time

path, n = sys.argv[1], int(sys.argv[2])
start = time.time()


def status():
    t = time.time() - start
    peers, routes = [], []
    for i in range(n):
        nid = f"{i + 1:016x}"
        relayed = i % 5 == 4
        via = f"{i:016x}" if relayed else None
        peers.append({
            "node_id": nid, "hostname": f"member-{i + 1}", "overlay": f"10.126.{(i + 2) // 250}.{(i + 2) % 250 + 1}",
            "endpoint": None if relayed else f"udp://198.51.100.{i % 250 + 1}:11010",
            "path": "relay" if relayed else "direct", "via": via, "via_hostname": f"member-{i}" if relayed else None,
            "hops": 2 if relayed else 1, "transport": "udp", "rtt_ms": 1.0 + i % 30, "loss": 0.0,
            "state": "established" if i % 3 else "idle", "link": i % 4 == 0, "last_handshake_secs": 10,
            "rx_bytes": int(t * 1000 * (i + 1)), "rx_packets": int(t * (i + 1)), "tx_bytes": int(t * 500 * (i + 1)),
            "tx_packets": int(t * (i + 1)), "drops": {}, "error": None, "key": f"{i + 1:064x}",
            "groups": ["dev"] if i % 2 else ["ops"], "cert_not_after": 1_900_000_000,
            "neighbours": [{"node_id": f"{(i + k) % n + 1:016x}", "rtt_ms": 2} for k in (1, 2, 3)],
        })
        routes.append({"node_id": nid, "hostname": f"member-{i + 1}", "overlay": peers[-1]["overlay"],
                       "next_hop": via or nid, "next_hop_hostname": None, "hops": peers[-1]["hops"],
                       "latency_ms": 2, "session": True, "proxied": []})
    return {
        "node_id": "0" * 16, "network_name": "bench", "hostname": "console", "overlay": "10.126.0.1/16",
        "cipher": "aes-128-gcm", "listeners": ["udp://0.0.0.0:11010"], "dev_name": "weft0",
        "offloads": {"tun": True, "tun_gro": True, "udp_gso": True, "udp_gro": True},
        "pipelines": [{"tx_packets": 0, "tx_bytes": int(t * 1e6), "tx_batches": 0, "rx_packets": 0,
                       "rx_bytes": int(t * 2e6), "rx_batches": 0, "drops": {}}],
        "threads": 1, "uptime_secs": int(t), "drops": {}, "peers": peers, "routes": routes,
        "address_conflicts": [], "proxy_networks": [], "pending_peers": [], "refused_handshakes": [],
    }


def serve(conn):
    with conn:
        line = conn.makefile().readline()
        try:
            req = json.loads(line)
        except ValueError:
            return
        if req.get("cmd") == "status":
            reply = {"result": "status", **status()}
        else:
            reply = {"result": "error", "message": "this stand-in only answers status"}
        conn.sendall((json.dumps(reply) + "\n").encode())


if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
