#!/usr/bin/env python3
"""Helper of mesh.sh: the seeded topology plan, and the summary of a run.

    mesh_report.py plan --nodes N --seed S --block-pct P
        prints one line per node "k parent" (parent 0 for the first node), then one line
        per blocked pair "block i j" (i < j). Node k dials one random earlier node; the
        blocked pairs are drawn from the pairs that are not such a dial, so the dial tree
        always connects the mesh and every blocked pair can only be reached relayed.

    mesh_report.py report DATA_DIR OUT_DIR
        reads what mesh.sh collected in DATA_DIR and writes OUT_DIR/results.json and
        OUT_DIR/results.md; prints the markdown.

Only the standard library; deterministic for a given seed (random.Random(seed)).
"""
import argparse
import json
import math
import os
import random
import sys


def plan(nodes, seed, block_pct):
    rng = random.Random(seed)
    parent = {1: 0}
    for k in range(2, nodes + 1):
        parent[k] = rng.randint(1, k - 1)
    tree = {(min(k, p), max(k, p)) for k, p in parent.items() if p}
    others = [(i, j) for i in range(1, nodes + 1) for j in range(i + 1, nodes + 1) if (i, j) not in tree]
    total = nodes * (nodes - 1) // 2
    want = min(len(others), round(total * block_pct / 100.0))
    blocked = sorted(rng.sample(others, want))
    return parent, blocked


def cmd_plan(a):
    parent, blocked = plan(a.nodes, a.seed, a.block_pct)
    for k in sorted(parent):
        print(k, parent[k])
    for i, j in blocked:
        print("block", i, j)


def pct(values, p):
    """Nearest-rank percentile; None for no values."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    r = max(1, math.ceil(p / 100.0 * len(v)))
    return v[r - 1]


def stats(values):
    v = [x for x in values if x is not None]
    if not v:
        return {"n": 0, "min": None, "median": None, "p95": None, "max": None}
    return {"n": len(v), "min": min(v), "median": pct(v, 50), "p95": pct(v, 95), "max": max(v)}


def read_kv(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if "=" in line:
                    k, _, v = line.partition("=")
                    out[k] = v
    return out


def read_procs(path):
    """Lines "k pid ticks rss_kib hwm_kib threads fds" -> {k: dict}."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) != 7:
                    continue
                out[int(p[0])] = dict(zip(("pid", "ticks", "rss_kib", "hwm_kib", "threads", "fds"), map(int, p[1:])))
    return out


def read_veth(path):
    """`ip -s -j link` of the switch namespace -> {port name: (rx_bytes, tx_bytes, rx_packets, tx_packets)}."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for link in json.load(f):
                s = link.get("stats64") or link.get("stats") or {}
                rx, tx = s.get("rx", {}), s.get("tx", {})
                out[link["ifname"]] = (rx.get("bytes", 0), tx.get("bytes", 0), rx.get("packets", 0), tx.get("packets", 0))
    return out


def parse_fping(path):
    """fping -C output ("ADDR : 0.41 - 0.33 ...") -> {addr: [rtt ms or None, ...]}."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if " : " not in line:
                continue
            addr, _, rest = line.partition(" : ")
            vals = []
            for tok in rest.split():
                if tok == "-":
                    vals.append(None)
                else:
                    try:
                        vals.append(float(tok))
                    except ValueError:
                        pass
            out[addr.strip()] = vals
    return out


def fmt(v, nd=1):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def cmd_report(a):
    d = a.data
    meta = read_kv(os.path.join(d, "meta.txt"))
    n = int(meta["nodes"])
    rest_s = float(meta.get("rest_window_s") or meta["rest_s"])
    clk = int(meta.get("clk_tck", "100"))
    addr = {}  # k -> overlay
    with open(os.path.join(d, "nodes.txt")) as f:
        for line in f:
            k, under, over = line.split()
            addr[int(k)] = over
    by_addr = {v: k for k, v in addr.items()}
    parent, blocked = {}, set()
    with open(os.path.join(d, "plan.txt")) as f:
        for line in f:
            p = line.split()
            if p[0] == "block":
                blocked.add((int(p[1]), int(p[2])))
            else:
                parent[int(p[0])] = int(p[1])

    def is_blocked(i, j):
        return (min(i, j), max(i, j)) in blocked

    # --- pings ------------------------------------------------------------------------
    answered = 0
    lost_first = {"direct": 0, "relayed": 0}
    first = {"direct": {"cold": [], "warm": []}, "relayed": {"cold": [], "warm": []}}
    steady = {"direct": [], "relayed": []}
    sent = recv = 0
    unanswered = []
    answered_pairs = set()
    for i in range(1, n + 1):
        res = parse_fping(os.path.join(d, "fping", f"n{i}.txt"))
        for j in range(1, n + 1):
            if j == i:
                continue
            kind = "relayed" if is_blocked(i, j) else "direct"
            vals = res.get(addr[j], [])
            sent += len(vals)
            got = [v for v in vals if v is not None]
            recv += len(got)
            if got:
                answered += 1
                answered_pairs.add((i, j))
            else:
                unanswered.append(f"n{i}->n{j}")
            if not vals:
                continue
            # Pings run node after node in index order, so n_i -> n_j with i < j is the
            # first packet the pair ever exchanges ("cold"); with i > j, n_j has pinged n_i before.
            temp = "cold" if i < j else "warm"
            if vals[0] is None:
                lost_first[kind] += 1
            else:
                first[kind][temp].append(vals[0])
            steady[kind].extend(v for v in vals[1:] if v is not None)
    both_ways = sum(1 for i in range(1, n + 1) for j in range(i + 1, n + 1)
                    if (i, j) in answered_pairs and (j, i) in answered_pairs)

    # --- paths as the nodes saw them at the end --------------------------------------------
    paths = {"direct": 0, "relay": 0, "other": 0}
    leaks = []       # blocked pairs a node shows as direct: the block did not hold
    unpunched = []   # open pairs still relayed
    established = []
    for i in range(1, n + 1):
        p = os.path.join(d, "peers", f"n{i}.json")
        est = 0
        try:
            with open(p) as f:
                peers = json.load(f)
        except (OSError, ValueError):
            peers = []
        if isinstance(peers, dict):
            peers = peers.get("peers", [])
        for pe in peers:
            j = by_addr.get(pe.get("overlay", "").split("/")[0])
            if j is None:
                continue
            if pe.get("state") == "established":
                est += 1
            path = pe.get("path")
            paths[path if path in ("direct", "relay") else "other"] += 1
            if path == "direct" and is_blocked(i, j):
                leaks.append(f"n{i}->n{j}")
            if path == "relay" and not is_blocked(i, j):
                unpunched.append(f"n{i}->n{j}")
        established.append(est)

    # --- rest window -------------------------------------------------------------------
    p0 = read_procs(os.path.join(d, "rest_start.txt"))
    p1 = read_procs(os.path.join(d, "rest_end.txt"))
    v0 = read_veth(os.path.join(d, "veth_start.json"))
    v1 = read_veth(os.path.join(d, "veth_end.json"))
    per_node = []
    for k in range(1, n + 1):
        a0, a1 = p0.get(k), p1.get(k)
        row = {"node": k, "parent": parent.get(k, 0)}
        if a0 and a1 and a0["pid"] == a1["pid"]:
            row["cpu_pct"] = 100.0 * (a1["ticks"] - a0["ticks"]) / clk / rest_s
            row["rss_mib"] = a1["rss_kib"] / 1024.0
            row["hwm_mib"] = a1["hwm_kib"] / 1024.0
            row["threads"] = a1["threads"]
            row["fds"] = a1["fds"]
        port = f"v{k}"
        if port in v0 and port in v1:
            # Counters of the switch's end of the node's veth: its rx is what the node sent.
            row["tx_bps"] = (v1[port][0] - v0[port][0]) / rest_s
            row["rx_bps"] = (v1[port][1] - v0[port][1]) / rest_s
            row["tx_pps"] = (v1[port][2] - v0[port][2]) / rest_s
            row["rx_pps"] = (v1[port][3] - v0[port][3]) / rest_s
        per_node.append(row)

    def col(key):
        return stats([r.get(key) for r in per_node])

    conv = {k: (float(v) if v not in ("", "none") else None) for k, v in read_kv(os.path.join(d, "converge.txt")).items()}
    block = read_kv(os.path.join(d, "block.txt"))
    total_pairs = n * (n - 1)
    result = {
        "nodes": n,
        "seed": int(meta["seed"]),
        "block_pct": float(meta["block_pct"]),
        "blocked_pairs": len(blocked),
        "tree_links": sum(1 for v in parent.values() if v),
        "weft": meta.get("weft", ""),
        "weft_flags": meta.get("weft_flags", ""),
        "machine": meta.get("machine", ""),
        "started": meta.get("started", ""),
        "rest_s": rest_s,
        "convergence": conv,
        "reachability": {
            "ordered_pairs": total_pairs,
            "answered": answered,
            "both_ways": both_ways,
            "unordered_pairs": total_pairs // 2,
            "echo_sent": sent,
            "echo_received": recv,
            "unanswered": unanswered[:50],
        },
        "latency_ms": {
            kind: {
                "first_cold": stats(first[kind]["cold"]),
                "first_warm": stats(first[kind]["warm"]),
                "steady": stats(steady[kind]),
                "first_lost": lost_first[kind],
            }
            for kind in ("direct", "relayed")
        },
        "paths_at_end": {
            "direct": paths["direct"], "relay": paths["relay"], "other": paths["other"],
            "blocked_pairs_shown_direct": len(leaks), "leaks": leaks[:50],
            "open_pairs_still_relayed": len(unpunched),
            "established_per_node": stats(established),
        },
        "underlay_block": {k: int(v) for k, v in block.items() if v.isdigit()},
        "at_rest": {
            "cpu_pct_of_one_core": col("cpu_pct"),
            "rss_mib": col("rss_mib"),
            "hwm_mib": col("hwm_mib"),
            "threads": col("threads"),
            "fds": col("fds"),
            "underlay_tx_bytes_per_s": col("tx_bps"),
            "underlay_rx_bytes_per_s": col("rx_bps"),
            "underlay_tx_packets_per_s": col("tx_pps"),
            "underlay_rx_packets_per_s": col("rx_pps"),
        },
        "per_node": per_node,
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")

    r = result
    L = []
    L.append(f"# Weft mesh of {n} real nodes in network namespaces")
    L.append("")
    L.append(f"`{meta.get('cmdline', 'bench/netns/mesh.sh')}` — {r['started']}; {r['machine']}; {r['weft']}"
             + (f"; flags `{r['weft_flags']}`" if r["weft_flags"] else ""))
    L.append("")
    L.append(f"Topology: seed {r['seed']}, {r['tree_links']} dial links (node k dials one random earlier node), "
             f"{r['blocked_pairs']} of {total_pairs // 2} pairs ({r['block_pct']:g} %) blocked on the underlay "
             f"(reachable only relayed).")
    L.append("")
    c = r["convergence"]
    L.append("| convergence | seconds |")
    L.append("|---|---|")
    L.append(f"| all {n} processes started | {fmt(c.get('start_s'))} |")
    L.append(f"| every node has a route to every other (from the first start) | {fmt(c.get('routes_s'))} |")
    L.append(f"| … and an end-to-end session with every other | {fmt(c.get('sessions_s'))} |")
    L.append("")
    rr = r["reachability"]
    L.append(f"**Reachability**: {rr['answered']} of {rr['ordered_pairs']} ordered pairs answered at least one ping; "
             f"{rr['both_ways']} of {rr['unordered_pairs']} pairs both ways; echo replies {rr['echo_received']} of {rr['echo_sent']}.")
    pa = r["paths_at_end"]
    L.append("")
    L.append(f"**Paths at the end** (`weft peers --json` of every node): {pa['direct']} direct, {pa['relay']} relayed, "
             f"{pa['other']} other; blocked pairs shown direct (block leaks): {pa['blocked_pairs_shown_direct']}; "
             f"open pairs still relayed: {pa['open_pairs_still_relayed']}.")
    ub = r["underlay_block"]
    if ub:
        L.append(f"Packets the underlay block dropped: {ub.get('dropped_packets', 0)} ({ub.get('dropped_bytes', 0)} bytes).")
    L.append("")
    L.append("| ping RTT (ms) | n | median | p95 | max | first lost |")
    L.append("|---|---|---|---|---|---|")
    for kind in ("direct", "relayed"):
        lk = r["latency_ms"][kind]
        for key, label in (("first_cold", "first packet, pair untouched"),
                           ("first_warm", "first packet, other way pinged before"),
                           ("steady", "later packets")):
            s = lk[key]
            lost = lk["first_lost"] if key == "first_cold" else ""
            L.append(f"| {kind}: {label} | {s['n']} | {fmt(s['median'], 2)} | {fmt(s['p95'], 2)} | {fmt(s['max'], 2)} | {lost} |")
    L.append("")
    L.append(f"| at rest, per node ({rest_s:g} s window) | median | p95 | max |")
    L.append("|---|---|---|---|")
    ar = r["at_rest"]
    for key, label, nd in (("cpu_pct_of_one_core", "CPU, % of one core", 2),
                           ("rss_mib", "RSS (VmRSS), MiB", 1),
                           ("hwm_mib", "peak RSS (VmHWM), MiB", 1),
                           ("threads", "threads", 0),
                           ("fds", "open fds", 0),
                           ("underlay_tx_bytes_per_s", "underlay sent, B/s", 0),
                           ("underlay_rx_bytes_per_s", "underlay received, B/s", 0),
                           ("underlay_tx_packets_per_s", "underlay sent, packets/s", 1)):
        s = ar[key]
        if nd == 0:
            vals = [None if v is None else round(v) for v in (s["median"], s["p95"], s["max"])]
        else:
            vals = [None if v is None else round(v, nd) for v in (s["median"], s["p95"], s["max"])]
        L.append(f"| {label} | " + " | ".join(fmt(v, nd) for v in vals) + " |")
    L.append("")
    md = "\n".join(L) + "\n"
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    sys.stdout.write(md)
    ok = rr["answered"] == rr["ordered_pairs"] and c.get("routes_s") is not None
    return 0 if ok else 3


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--block-pct", type=float, required=True)
    r = sub.add_parser("report")
    r.add_argument("data")
    r.add_argument("out")
    a = ap.parse_args()
    if a.cmd == "plan":
        cmd_plan(a)
        return 0
    return cmd_report(a)


if __name__ == "__main__":
    sys.exit(main())
