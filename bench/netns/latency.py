#!/usr/bin/env python3
"""Latency side of bench/netns/latency.sh (compare.sh with LATENCY=1).

  latency.py echo PORT                       UDP echo server (the game flow's far end)
  latency.py game TARGET PORT SECS OUT.json  50 packets/s of 100 bytes for SECS, echoed:
                                             round trips, loss and jitter into OUT.json
  latency.py record --tool T --mode M --idle PING.txt --loaded PING.txt --game GAME.json
                    --iperf IPERF.json --rep N
                                             one JSON line for runs.jsonl
  latency.py line                            a one-line summary of the JSON line on stdin
  latency.py report --runs RUNS --meta META --out DIR
                                             latency.md, latency.json, latency.svg

Percentiles are nearest-rank over every reply; a lost ping counts as lost, not as a
round trip. Jitter is RFC 3550's: the mean absolute difference of consecutive round
trips of the game flow.
"""

import json
import math
import re
import socket
import struct
import sys
import time


def echo(port):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", int(port)))
    while True:
        data, addr = s.recvfrom(2048)
        s.sendto(data, addr)


def game(target, port, secs, out):
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.setblocking(False)
    n = int(float(secs) * 50)
    sent = {}
    rtts = []
    start = time.monotonic()
    for i in range(n):
        due = start + i / 50.0
        while True:
            now = time.monotonic()
            if now >= due:
                break
            _drain(s, sent, rtts)
            time.sleep(min(0.001, due - now))
        payload = struct.pack("!Id", i, time.monotonic()).ljust(100, b"g")
        s.sendto(payload, (target, int(port)))
        sent[i] = True
    end = time.monotonic() + 1.0
    while time.monotonic() < end and len(rtts) < n:
        _drain(s, sent, rtts)
        time.sleep(0.001)
    jitter = sum(abs(a - b) for a, b in zip(rtts, rtts[1:])) / max(1, len(rtts) - 1)
    with open(out, "w") as f:
        json.dump({"sent": n, "received": len(rtts), "rtts_ms": rtts, "jitter_ms": jitter}, f)


def _drain(s, sent, rtts):
    while True:
        try:
            data = s.recv(2048)
        except BlockingIOError:
            return
        if len(data) >= 12:
            i, t = struct.unpack("!Id", data[:12])
            if sent.pop(i, None):
                rtts.append((time.monotonic() - t) * 1000.0)


PING_TIME = re.compile(r"icmp_seq=(\d+) .*time=([0-9.]+) ms")
PING_SENT = re.compile(r"(\d+) packets transmitted")


def parse_ping(path):
    rtts, sent = [], 0
    try:
        text = open(path).read()
    except OSError:
        return {"sent": 0, "rtts_ms": []}
    seen = set()
    for m in PING_TIME.finditer(text):
        if m.group(1) not in seen:  # a duplicate reply is not a second round trip
            seen.add(m.group(1))
            rtts.append(float(m.group(2)))
    m = PING_SENT.search(text)
    if m:
        sent = int(m.group(1))
    return {"sent": max(sent, len(rtts)), "rtts_ms": rtts}


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, math.ceil(p / 100.0 * len(v)) - 1))
    return v[k]


def summary(samples):
    rtts = samples.get("rtts_ms", [])
    sent = samples.get("sent", 0)
    return {
        "sent": sent,
        "lost": max(0, sent - len(rtts)),
        "p50": pct(rtts, 50),
        "p99": pct(rtts, 99),
        "p999": pct(rtts, 99.9),
    }


def record(args):
    a = dict(zip(args[::2], args[1::2]))
    idle = summary(parse_ping(a["--idle"]))
    loaded = summary(parse_ping(a["--loaded"]))
    try:
        g = json.load(open(a["--game"]))
        game_s = summary(g)
        game_s["jitter"] = g.get("jitter_ms")
    except (OSError, ValueError):
        game_s = None
    gbps = None
    try:
        it = json.load(open(a["--iperf"]))
        gbps = it["end"]["sum_received"]["bits_per_second"] / 1e9
    except (OSError, ValueError, KeyError, TypeError):
        pass
    print(json.dumps({
        "rep": int(a.get("--rep", 1)),
        "tool": a["--tool"],
        "mode": a["--mode"],
        "idle": idle,
        "loaded": loaded,
        "game": game_s,
        "bulk_gbps": gbps,
        "note": a.get("--note", ""),
    }))


def fmt(v, unit=""):
    return "—" if v is None else (f"{v:.2f}{unit}" if v < 10 else f"{v:.1f}{unit}")


def line():
    r = json.loads(sys.stdin.readline())
    i, l, g = r["idle"], r["loaded"], r["game"] or {}
    print(f"  {r['tool']} ({r['mode']}): idle p50/p99 {fmt(i['p50'])}/{fmt(i['p99'])} ms; "
          f"beside bulk {fmt(l['p50'])}/{fmt(l['p99'])}/{fmt(l['p999'])} ms (lost {l['lost']}), "
          f"bulk {fmt(r['bulk_gbps'])} Gbit/s; game jitter {fmt(g.get('jitter'))} ms, "
          f"lost {g.get('lost', '—')}/{g.get('sent', '—')}")


def median(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def report(args):
    a = dict(zip(args[::2], args[1::2]))
    runs = [json.loads(l) for l in open(a["--runs"]) if l.strip()]
    meta = dict(l.rstrip("\n").split("=", 1) for l in open(a["--meta"]) if "=" in l)
    rows = {}
    for r in runs:
        rows.setdefault((r["tool"], r["mode"]), []).append(r)
    table = []
    for (tool, mode), rs in rows.items():
        def m(path):
            vals = []
            for r in rs:
                v = r
                for k in path:
                    v = (v or {}).get(k) if isinstance(v, dict) else None
                vals.append(v)
            return median(vals)
        table.append({
            "tool": tool, "mode": mode, "runs": len(rs),
            "idle_p50": m(["idle", "p50"]), "idle_p99": m(["idle", "p99"]), "idle_p999": m(["idle", "p999"]),
            "loaded_p50": m(["loaded", "p50"]), "loaded_p99": m(["loaded", "p99"]),
            "loaded_p999": m(["loaded", "p999"]), "loaded_lost": m(["loaded", "lost"]),
            "bulk_gbps": m(["bulk_gbps"]),
            "game_p99": m(["game", "p99"]), "game_jitter": m(["game", "jitter"]),
            "game_lost": m(["game", "lost"]), "game_sent": m(["game", "sent"]),
        })
    out = a["--out"]
    with open(f"{out}/latency.json", "w") as f:
        json.dump({"meta": meta, "rows": table, "runs": runs}, f, indent=1)
    md = [
        "# Latency through the tunnel, idle and beside one bulk stream",
        "",
        f"{meta.get('date', '')}, {meta.get('cpu', '')} ({meta.get('nproc', '?')} cores), "
        f"{meta.get('kernel', '')}; `{meta.get('cmdline', '')}`; REPS={meta.get('reps')}, "
        f"bulk run {meta.get('duration')} s.",
        "",
        f"Round trips in ms (ping every 10 ms, {meta.get('direction', 'B -> A')}; beside an iperf3 stream "
        "the same way), "
        "medians over repetitions; game: 50 packets/s of 100 bytes over UDP beside the "
        "same bulk stream.",
        "",
        "| tool | mode | idle p50 | idle p99 | idle p99.9 | loaded p50 | loaded p99 | loaded p99.9 "
        "| bulk Gbit/s | game p99 | game jitter | game lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        lost = "—" if t["game_sent"] is None else f"{int(t['game_lost'])}/{int(t['game_sent'])}"
        md.append(
            f"| {t['tool']} | {t['mode']} | {fmt(t['idle_p50'])} | {fmt(t['idle_p99'])} | "
            f"{fmt(t['idle_p999'])} | {fmt(t['loaded_p50'])} | {fmt(t['loaded_p99'])} | "
            f"{fmt(t['loaded_p999'])} | {fmt(t['bulk_gbps'])} | {fmt(t['game_p99'])} | "
            f"{fmt(t['game_jitter'])} | {lost} |")
    for k, v in sorted(meta.items()):
        if k.startswith("version.") or k.startswith("skip."):
            md.append(f"\n{k}: {v}")
    with open(f"{out}/latency.md", "w") as f:
        f.write("\n".join(md) + "\n")
    with open(f"{out}/latency.svg", "w") as f:
        f.write(chart(table))


def chart(table):
    """Horizontal bars: loaded p50 and p99 per row, log scale from 0.01 ms."""
    w, row_h, left, top = 760, 26, 250, 40
    h = top + row_h * len(table) + 40
    lo, hi = math.log10(0.01), math.log10(max([t["loaded_p99"] or 0.1 for t in table] + [1.0]) * 1.5)

    def x(v):
        v = max(v or 0.01, 0.01)
        return left + (w - left - 20) * (math.log10(v) - lo) / (hi - lo)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<text x="10" y="20" font-size="14">Round trip beside one bulk stream (ms, log scale): '
           f'p50 dark, p99 light</text>']
    for i, t in enumerate(table):
        y = top + i * row_h
        out.append(f'<text x="10" y="{y + 15}">{t["tool"]} ({t["mode"]})</text>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{x(t["loaded_p99"]) - left:.1f}" height="16" fill="#9ecae1"/>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{x(t["loaded_p50"]) - left:.1f}" height="16" fill="#3182bd"/>')
        out.append(f'<text x="{x(t["loaded_p99"]) + 4:.1f}" y="{y + 15}">{fmt(t["loaded_p50"])} / {fmt(t["loaded_p99"])}</text>')
    for v in (0.01, 0.1, 1, 10, 100):
        if math.log10(v) <= hi:
            out.append(f'<line x1="{x(v):.1f}" y1="{top - 5}" x2="{x(v):.1f}" y2="{h - 30}" stroke="#ccc"/>')
            out.append(f'<text x="{x(v) - 8:.1f}" y="{h - 15}">{v:g}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "echo":
        echo(*rest)
    elif cmd == "game":
        game(*rest)
    elif cmd == "record":
        record(rest)
    elif cmd == "line":
        line()
    elif cmd == "report":
        report(rest)
    else:
        sys.exit(f"unknown command {cmd}")
