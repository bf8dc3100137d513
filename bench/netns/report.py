#!/usr/bin/env python3
"""Helpers for bench/netns/compare.sh (standard library only).

  report.py record --iperf FILE --rc N --rep N --tool T --mode M --streams N --direction D ...
      prints one JSON line describing one iperf3 run (or a failed start with --failed REASON)
  report.py line < one JSON line
      prints a one-line human summary of that run
  report.py report --runs runs.jsonl --meta meta.txt --out DIR
      writes DIR/results.md, DIR/results.json and DIR/chart.svg and prints the table
  report.py peer --overlay ADDR < `weft status --json`
      prints "STATE PATH TRANSPORT" of the peer with that overlay address (exit 1 if none)
"""

import argparse
import json
import statistics
import sys
from html import escape
from pathlib import Path

DIRECTIONS = {"b-to-a": "B→A", "a-to-b": "A→B (-R)"}
BASELINE = "direct"
SELF = "weft"
# A second baseline: iperf3 over lo inside namespace A (no veth, no tunnel).
LOOPBACK = "loopback"


def _num(s, cast=float):
    if s is None or s == "":
        return None
    try:
        return cast(s)
    except ValueError:
        return None


def cmd_record(a):
    run = {
        "rep": int(a.rep),
        "tool": a.tool,
        "mode": a.mode,
        "streams": int(a.streams),
        "direction": a.direction,
        "duration_s": int(a.duration),
        "gbps": None,
        "retransmits": None,
        "cpu_pct": _num(a.cpu),
        "peak_rss_mib": None,
        "error": None,
    }
    if a.version:
        run["version"] = a.version
    rss = _num(a.rss_kib, int)
    if rss:
        run["peak_rss_mib"] = round(rss / 1024, 1)
    if a.failed is not None:
        wrong = a.failed.startswith("wrong transport")
        run["error"] = a.failed if wrong else "did not start: " + a.failed
        run["cpu_pct"] = None
        print(json.dumps(run))
        return
    doc = None
    try:
        doc = json.loads(Path(a.iperf).read_text())
    except (OSError, ValueError) as e:
        run["error"] = f"no iperf3 JSON (exit {a.rc}): {e}"
    if doc is not None:
        end = doc.get("end", {})
        recv = end.get("sum_received", {})
        sent = end.get("sum_sent", {})
        if doc.get("error"):
            run["error"] = "iperf3: " + str(doc["error"])
        if recv.get("bits_per_second") is not None and not doc.get("error"):
            run["gbps"] = round(recv["bits_per_second"] / 1e9, 4)
            run["bytes_received"] = recv.get("bytes")
            run["seconds"] = recv.get("seconds")
        if sent.get("retransmits") is not None:
            run["retransmits"] = sent["retransmits"]
        cpu = end.get("cpu_utilization_percent")
        if cpu:
            run["iperf3_cpu"] = {k: round(v, 1) for k, v in cpu.items() if isinstance(v, (int, float))}
        if not run["error"] and run["gbps"] is None:
            run["error"] = f"iperf3 exit {a.rc} without a result"
    if a.rc not in ("0", "") and not run["error"]:
        run["error"] = f"iperf3 exit {a.rc}"
    if a.note:
        run["note"] = a.note
    print(json.dumps(run))


def cmd_line(_a):
    r = json.loads(sys.stdin.readline())
    g = "FAIL" if r["gbps"] is None else f"{r['gbps']:.2f} Gbit/s"
    extra = []
    if r.get("retransmits") is not None:
        extra.append(f"retr {r['retransmits']}")
    if r.get("cpu_pct") is not None:
        extra.append(f"cpu {r['cpu_pct']:.0f}%")
    if r.get("peak_rss_mib") is not None:
        extra.append(f"rss {r['peak_rss_mib']:.1f} MiB")
    if r.get("error"):
        extra.append(r["error"])
    if r.get("note"):
        extra.append(r["note"])
    print(f"  rep {r['rep']} {r['tool']:<12} {r['mode']:<18} -P {r['streams']} {r['direction']:<7} {g:>15}  "
          + ", ".join(extra))


def cmd_peer(a):
    try:
        st = json.load(sys.stdin)
    except ValueError as e:
        print(f"unreadable status: {e}")
        sys.exit(1)
    for p in st.get("peers", []):
        if str(p.get("overlay", "")).split("/")[0] == a.overlay:
            print(f"{p.get('state')} {p.get('path')} {p.get('transport')}")
            return
    print(f"no peer {a.overlay}")
    sys.exit(1)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs):
    keys, groups = [], {}
    for r in runs:
        k = (r["tool"], r["mode"], r["streams"], r["direction"])
        if k not in groups:
            keys.append(k)
            groups[k] = []
        groups[k].append(r)
    rows = []
    for k in keys:
        g = groups[k]
        rss = [r["peak_rss_mib"] for r in g if r.get("peak_rss_mib") is not None]
        rows.append({
            "tool": k[0], "mode": k[1], "streams": k[2], "direction": k[3],
            "runs": len(g), "ok_runs": sum(1 for r in g if r["gbps"] is not None),
            "median_gbps": _median([r["gbps"] for r in g]),
            "median_retransmits": _median([r.get("retransmits") for r in g if r["gbps"] is not None]),
            "median_cpu_pct": _median([r.get("cpu_pct") for r in g if r["gbps"] is not None]),
            "median_cpu_per_gbps": _median([r["cpu_pct"] / r["gbps"] for r in g
                                            if r["gbps"] and r.get("cpu_pct") is not None]),
            "peak_rss_mib": max(rss) if rss else None,
            "errors": sorted({r["error"] for r in g if r.get("error")}),
        })
    for row in rows:
        same = [x for x in rows if x["streams"] == row["streams"] and x["direction"] == row["direction"]
                and x["median_gbps"] is not None]
        base = [x["median_gbps"] for x in same if x["tool"] == BASELINE]
        others = [x["median_gbps"] for x in same if x["tool"] not in (BASELINE, SELF, LOOPBACK)]
        v = row["median_gbps"]
        row["ratio_direct"] = v / base[0] if v is not None and base and base[0] else None
        best = max(others) if others else None
        row["best_non_weft_gbps"] = best
        row["ratio_best_non_weft"] = v / best if v is not None and best else None
    return rows


def _f(v, fmt):
    return "–" if v is None else format(v, fmt)


def table(rows):
    head = ["tool", "cipher/mode", "streams", "direction", "median Gbit/s", "× direct",
            "× best non-weft", "retransmits", "CPU %", "CPU % per Gbit/s", "peak RSS MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        g = "FAIL" if r["median_gbps"] is None else format(r["median_gbps"], ".2f")
        if r["ok_runs"] and r["ok_runs"] < r["runs"]:
            g += f" ({r['ok_runs']}/{r['runs']} ok)"
        cells = [
            f"**{r['tool']}**" if r["tool"] == SELF else r["tool"], r["mode"], str(r["streams"]),
            DIRECTIONS.get(r["direction"], r["direction"]), g,
            _f(r["ratio_direct"], ".2f"),
            "–" if r["tool"] == BASELINE else _f(r["ratio_best_non_weft"], ".2f"),
            _f(r["median_retransmits"], ".0f"),
            "–" if r["tool"] == BASELINE else _f(r["median_cpu_pct"], ".0f"),
            "–" if r["tool"] == BASELINE else _f(r.get("median_cpu_per_gbps"), ".1f"),
            "–" if r["tool"] == BASELINE else _f(r["peak_rss_mib"], ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chart(rows, title):
    single = [r for r in rows if r["streams"] == 1]
    labels = []
    for r in single:
        lab = r["tool"] if r["mode"] in ("veth", "lo", "default") else f"{r['tool']} {r['mode']}"
        if lab not in labels:
            labels.append(lab)
    dirs = [d for d in DIRECTIONS if any(r["direction"] == d for r in single)]
    colors = {"b-to-a": "#3b6fb6", "a-to-b": "#e08a2c"}
    val = {}
    for r in single:
        lab = r["tool"] if r["mode"] in ("veth", "lo", "default") else f"{r['tool']} {r['mode']}"
        val[(lab, r["direction"])] = r["median_gbps"]
    vmax = max([v for v in val.values() if v] or [1.0])
    left, width, bar, gap, top = 230, 480, 16, 14, 64
    group_h = bar * max(len(dirs), 1) + gap
    height = top + group_h * len(labels) + 48
    total_w = left + width + 110
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{height}" '
           f'viewBox="0 0 {total_w} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{total_w}" height="{height}" fill="white"/>',
           f'<text x="{total_w / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
           f'{escape(title)}</text>']
    lx = left
    for d in dirs:
        out.append(f'<rect x="{lx}" y="34" width="12" height="12" fill="{colors[d]}"/>')
        out.append(f'<text x="{lx + 16}" y="44">{escape(DIRECTIONS[d])}</text>')
        lx += 130
    # grid
    step = _nice_step(vmax)
    t = 0.0
    while t <= vmax * 1.0001:
        x = left + width * t / vmax
        out.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - 30}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{height - 16}" text-anchor="middle" fill="#555">{t:g}</text>')
        t += step
    out.append(f'<text x="{left + width / 2}" y="{height - 4}" text-anchor="middle" fill="#555">'
               'Gbit/s (median, single TCP stream)</text>')
    for i, lab in enumerate(labels):
        y0 = top + i * group_h
        weight = ' font-weight="bold"' if lab.startswith(SELF) else ""
        out.append(f'<text x="{left - 8}" y="{y0 + group_h / 2 - gap / 2 + 4}" text-anchor="end"{weight}>'
                   f'{escape(lab)}</text>')
        for j, d in enumerate(dirs):
            v = val.get((lab, d))
            y = y0 + j * bar
            if v is None:
                out.append(f'<text x="{left + 4}" y="{y + bar - 4}" fill="#b00">failed</text>')
                continue
            w = max(width * v / vmax, 1)
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 2}" fill="{colors[d]}"/>')
            out.append(f'<text x="{left + w + 4:.1f}" y="{y + bar - 5}">{v:.2f}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _nice_step(vmax):
    for s in (0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 25, 50, 100):
        if vmax / s <= 8:
            return s
    return vmax / 5


def read_meta(path):
    meta = {"version": {}, "skip": {}}
    for line in Path(path).read_text().splitlines():
        if "=" not in line:
            continue
        k, v = line.split("=", 1)
        if k.startswith("version."):
            meta["version"][k[8:]] = v
        elif k.startswith("skip."):
            meta["skip"][k[5:]] = v
        else:
            meta[k] = v
    return meta


def cmd_report(a):
    runs = [json.loads(x) for x in Path(a.runs).read_text().splitlines() if x.strip()]
    meta = read_meta(a.meta)
    rows = summarize(runs)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=2) + "\n")
    quick = meta.get("quick") == "1"
    title = "Weft netns throughput comparison" + (" (smoke run)" if quick else "")
    (out / "chart.svg").write_text(chart(rows, title))
    tab = table(rows)
    md = [f"# {title}", ""]
    if quick:
        md += ["**Smoke run (`--quick`): one short repetition; not a result.**", ""]
    md += [
        f"- date: {meta.get('date', '?')}",
        f"- command: `{meta.get('cmdline', '?')}`",
        f"- machine: {meta.get('nproc', '?')} CPUs, {meta.get('cpu', '?')}, {meta.get('memory', '?')}",
        f"- kernel: {meta.get('kernel', '?')}; OS: {meta.get('os', '?')}; load average at the end: {meta.get('loadavg', '?')}",
        f"- settings: REPS={meta.get('reps')} DURATION={meta.get('duration')}s STREAMS=\"{meta.get('streams')}\" "
        f"MTU={meta.get('mtu')} WEFT_FLAGS=\"{meta.get('weft_flags', '')}\" "
        f"WEFT_TRANSPORTS=\"{meta.get('weft_transports', '')}\"",
        "",
        "Versions:",
        "",
    ]
    for k, v in sorted(meta["version"].items()):
        md.append(f"- {k}: {v}")
    md += ["", "## Results", "", tab, ""]
    if meta["skip"]:
        md += ["## Skipped", ""]
        for k, v in sorted(meta["skip"].items()):
            md.append(f"- {k}: {v}")
        md.append("")
    errs = [r for r in rows if r["errors"]]
    if errs:
        md += ["## Errors", ""]
        for r in errs:
            md.append(f"- {r['tool']} {r['mode']} -P {r['streams']} {r['direction']}: " + "; ".join(r["errors"]))
        md.append("")
    md += [
        "## How to read this",
        "",
        "- Two network namespaces joined by one veth pair (198.51.100.1/24 and 198.51.100.2/24); "
        "the iperf3 server runs in A, the client in B. `direct` is iperf3 over the veth itself; `loopback` is "
        "iperf3 over lo inside A (the baseline EasyTier's table and the tun-rs benchmark quote); every tunnel "
        "carries iperf3 between 10.200.0.1 and 10.200.0.2 (Weft's \"over ipv6\" rows: UDP underlay, iperf3 between "
        "fd00:200::1 and fd00:200::2 on the IPv6 overlay).",
        "- Weft rows are \"CIPHER over TRANSPORT\": both nodes listen on that transport only (`-l`), B dials A "
        "on it, and every iperf3 run starts only after both nodes' `weft status --json` shows the peer "
        "established and direct over that transport (a row that fails this check is marked FAIL with the "
        "transport the nodes showed instead).",
        "- B→A: the client (B) sends; A→B: iperf3 `-R`, the server (A) sends. Gbit/s is iperf3's "
        "`end.sum_received.bits_per_second`; retransmits are `end.sum_sent.retransmits`. Values are medians "
        "over the repetitions; repetitions were interleaved (repetition loop outermost, tools inside).",
        "- × direct: median / the direct baseline's median in the same streams and direction. "
        "× best non-weft: median / the best median among the other tunnels (not direct, loopback or weft) there.",
        "- CPU %: utime+stime of the tunnel processes of both nodes (all threads) during the iperf3 run, "
        "divided by wall time; 100 % = one core. iperf3's own CPU is not included. CPU % per Gbit/s: the "
        "median over repetitions of CPU % / Gbit/s, what a tunnel spends per bit; on a shared, noisy machine it "
        "moves less than throughput does. Peak RSS: the larger "
        "VmHWM of the two nodes at the end of a run, reset (`/proc/PID/clear_refs` 5) just before it, so it is the "
        "peak under traffic and not a start-up step (weft's Argon2id key derivation takes 46 MiB for a moment, "
        "freed at once); max over repetitions (each tool is restarted for every repetition).",
        "- Every other tool runs with its defaults apart from the overlay addresses and MTU (versions above; "
        "Debian 12's wireguard-go 0.0.20220316 predates wireguard-go's TUN and UDP offload work). "
        "No sysctl is changed: the root namespace is left alone.",
        "- On a 2-core machine, the tunnel processes, iperf3 and the kernel share the same cores, so "
        "multi-stream and CPU numbers mostly show contention.",
        "",
        "![single-stream medians](chart.svg)",
        "",
    ]
    (out / "results.md").write_text("\n".join(md))
    print(tab)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--iperf")
    r.add_argument("--rc", default="0")
    r.add_argument("--failed")
    for k in ("rep", "tool", "mode", "streams", "direction", "duration"):
        r.add_argument("--" + k, required=True)
    for k in ("cpu", "rss-kib", "version", "note"):
        r.add_argument("--" + k, default="")
    sub.add_parser("line")
    pp = sub.add_parser("peer")
    pp.add_argument("--overlay", required=True)
    rp = sub.add_parser("report")
    rp.add_argument("--runs", required=True)
    rp.add_argument("--meta", required=True)
    rp.add_argument("--out", required=True)
    a = p.parse_args()
    {"record": cmd_record, "line": cmd_line, "report": cmd_report, "peer": cmd_peer}[a.cmd](a)


if __name__ == "__main__":
    main()
