#!/usr/bin/env python3
"""Helpers for bench/netns/loss.sh (standard library only).

  loss_report.py record --rep N --loss PCT --variant V [--iperf FILE --rc N]
                        [--counters "SEEN BIG DROP" "SEEN BIG DROP"] [--status A.json B.json]
                        [--failed REASON] [--note TEXT]
      prints one JSON line describing one run
  loss_report.py line < one JSON line
      prints a one-line human summary of that run
  loss_report.py report --runs runs.jsonl --meta meta.txt --out DIR
      writes DIR/results.md and DIR/results.json and prints the main table
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

BASE = "plain"
LABEL = {"plain": "plain TCP (no tunnel)"}


def label(v):
    return LABEL.get(v, f"weft over {v}")


def _counters(s):
    try:
        seen, big, drop = (int(x) for x in s.split())
    except (AttributeError, ValueError):
        return None
    return seen, big, drop


def _status_summary(paths):
    """Drops and transport counters of both nodes, summed: what the engineer needs to
    see when a transport misbehaves."""
    out = {"drops": {}, "transport_counters": {}, "connections": []}
    for p in paths:
        try:
            st = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        for k in ("drops", "transport_counters"):
            for name, v in (st.get(k) or {}).items():
                if isinstance(v, (int, float)) and v:
                    out[k][name] = out[k].get(name, 0) + v
        out["connections"].append(st.get("connections"))
    return out


def cmd_record(a):
    run = {"rep": int(a.rep), "loss_pct": a.loss, "variant": a.variant, "mbps": None,
           "retransmits": None, "error": None}
    if a.failed is not None:
        run["error"] = "did not start: " + a.failed
        print(json.dumps(run))
        return
    try:
        doc = json.loads(Path(a.iperf).read_text())
    except (OSError, ValueError, TypeError) as e:
        doc = None
        run["error"] = f"no iperf3 JSON (exit {a.rc}): {e}"
    if doc is not None:
        end = doc.get("end", {})
        recv, sent = end.get("sum_received", {}), end.get("sum_sent", {})
        if doc.get("error"):
            run["error"] = "iperf3: " + str(doc["error"])
        elif recv.get("bits_per_second") is not None:
            run["mbps"] = round(recv["bits_per_second"] / 1e6, 2)
            run["seconds"] = recv.get("seconds")
        if sent.get("retransmits") is not None:
            run["retransmits"] = sent["retransmits"]
        # Seconds in which the receiver got nothing: stalls show up here.
        ivs = [iv.get("sum", {}).get("bits_per_second", 0) for iv in doc.get("intervals", [])]
        if ivs:
            run["zero_intervals"] = sum(1 for v in ivs if v < 1e5)
            run["min_interval_mbps"] = round(min(ivs) / 1e6, 2)
        if not run["error"] and run["mbps"] is None:
            run["error"] = f"iperf3 exit {a.rc} without a result"
    if a.rc not in ("0", "") and not run["error"]:
        run["error"] = f"iperf3 exit {a.rc}"
    if a.counters:
        c0, c1 = (_counters(x) for x in a.counters)
        if c0 and c1:
            seen, big, drop = (c1[i] - c0[i] for i in range(3))
            run["underlay_packets"] = seen
            run["underlay_dropped"] = drop
            run["underlay_oversize"] = big
            run["applied_loss_pct"] = round(100 * drop / seen, 3) if seen else None
    if a.status:
        run["weft_status"] = _status_summary(a.status)
    if a.note:
        run["note"] = a.note
    print(json.dumps(run))


def cmd_line(_a):
    r = json.loads(sys.stdin.readline())
    g = "FAIL" if r["mbps"] is None else f"{r['mbps']:.0f} Mbit/s"
    extra = []
    if r.get("retransmits") is not None:
        extra.append(f"retr {r['retransmits']}")
    if r.get("applied_loss_pct") is not None:
        extra.append(f"dropped {r['applied_loss_pct']:.2f} % of {r['underlay_packets']} pkts")
    if r.get("zero_intervals"):
        extra.append(f"{r['zero_intervals']} s with nothing received")
    ws = r.get("weft_status") or {}
    if ws.get("drops"):
        extra.append("drops " + ",".join(f"{k}={v}" for k, v in sorted(ws["drops"].items())))
    tc = {k: v for k, v in (ws.get("transport_counters") or {}).items() if k not in ("accepted", "dialled")}
    if tc:
        extra.append("links " + ",".join(f"{k}={v}" for k, v in sorted(tc.items())))
    if r.get("error"):
        extra.append(r["error"])
    if r.get("note"):
        extra.append(r["note"])
    print(f"  rep {r['rep']} loss {r['loss_pct']:>4} % {label(r['variant']):<22} {g:>13}  " + ", ".join(extra))


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def read_meta(path):
    meta = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            meta[k] = v
    return meta


def summarize(runs, rates, variants):
    cells = {}
    for v in variants:
        for rate in rates:
            g = [r for r in runs if r["variant"] == v and r["loss_pct"] == rate]
            ok = [r for r in g if r["mbps"] is not None]
            cells[(v, rate)] = {
                "variant": v, "loss_pct": rate, "runs": len(g), "ok_runs": len(ok),
                "median_mbps": _median([r["mbps"] for r in ok]),
                "median_retransmits": _median([r.get("retransmits") for r in ok]),
                "median_applied_loss_pct": _median([r.get("applied_loss_pct") for r in g]),
                "seconds_with_nothing_received": sum(r.get("zero_intervals") or 0 for r in ok),
                "errors": sorted({r["error"] for r in g if r.get("error")} | {r["note"] for r in g if r.get("note")}),
            }
    for (v, rate), c in cells.items():
        base = cells.get((BASE, rate), {}).get("median_mbps")
        c["ratio_plain"] = c["median_mbps"] / base if c["median_mbps"] is not None and base else None
        ref = cells.get((v, rates[0]), {}).get("median_mbps") if rates else None
        c["ratio_own_lossless"] = c["median_mbps"] / ref if c["median_mbps"] is not None and ref else None
    return cells


def _fmt_mbps(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def tables(cells, rates, variants):
    head = "| | " + " | ".join(f"{r} % loss" for r in rates) + " |"
    sep = "|---|" + "|".join("---" for _ in rates) + "|"
    t1 = [head, sep]
    for v in variants:
        row = []
        for rate in rates:
            c = cells[(v, rate)]
            if c["median_mbps"] is None:
                row.append("FAIL")
                continue
            s = _fmt_mbps(c["median_mbps"])
            if v != BASE and c["ratio_plain"] is not None:
                s += f" (×{c['ratio_plain']:.2f})"
            if c["ok_runs"] < c["runs"]:
                s += f" [{c['ok_runs']}/{c['runs']} ok]"
            row.append(s)
        t1.append(f"| {label(v)} | " + " | ".join(row) + " |")
    t2 = [head, sep]
    for v in variants:
        row = [("–" if cells[(v, r)]["median_retransmits"] is None else f"{cells[(v, r)]['median_retransmits']:.0f}")
               for r in rates]
        t2.append(f"| {label(v)} | " + " | ".join(row) + " |")
    t3 = [head, sep]
    for v in variants:
        row = [("–" if cells[(v, r)]["ratio_own_lossless"] is None else f"{cells[(v, r)]['ratio_own_lossless']:.2f}")
               for r in rates]
        t3.append(f"| {label(v)} | " + " | ".join(row) + " |")
    applied = []
    for rate in rates:
        xs = [cells[(v, rate)]["median_applied_loss_pct"] for v in variants]
        xs = [x for x in xs if x is not None]
        applied.append(f"{rate} %: {min(xs):.2f}–{max(xs):.2f} %" if xs else f"{rate} %: –")
    return "\n".join(t1), "\n".join(t2), "\n".join(t3), "; ".join(applied)


def cmd_report(a):
    runs = [json.loads(x) for x in Path(a.runs).read_text().splitlines() if x.strip()]
    meta = read_meta(a.meta)
    rates = meta.get("loss", "").split() or sorted({r["loss_pct"] for r in runs}, key=float)
    variants = [BASE] + meta.get("transports", "").split()
    cells = summarize(runs, rates, variants)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = [cells[(v, r)] for v in variants for r in rates]
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=2) + "\n")
    t1, t2, t3, applied = tables(cells, rates, variants)
    quick = meta.get("quick") == "1"
    md = ["# Weft throughput under packet loss" + (" (smoke run)" if quick else ""), ""]
    if quick:
        md += ["**Smoke run (`--quick`): one short repetition; not a result.**", ""]
    md += [
        f"- date: {meta.get('date', '?')}",
        f"- command: `{meta.get('cmdline', '?')}`",
        f"- machine: {meta.get('nproc', '?')} CPUs, {meta.get('cpu', '?')}; kernel {meta.get('kernel', '?')}; "
        f"load average at the end: {meta.get('loadavg', '?')}",
        f"- settings: REPS={meta.get('reps')} DURATION={meta.get('duration')}s LOSS=\"{meta.get('loss')}\" "
        f"CIPHER={meta.get('cipher')} WEFT_FLAGS=\"{meta.get('weft_flags', '')}\"",
        f"- weft: {meta.get('weft', '?')}; {meta.get('iperf3', '')}",
        f"- underlay round-trip time (ping over the veth, no loss): {meta.get('underlay_rtt', '?')}",
        "",
        "## Throughput, median Mbit/s (× plain TCP at the same loss rate)",
        "",
        t1,
        "",
        f"Loss actually applied (dropped / arrived on the veth, both directions, median per cell, "
        f"range over the rows): {applied}.",
        "",
        "## Retransmits of the inner TCP (iperf3 sender), median",
        "",
        t2,
        "",
        f"## Throughput relative to the same row at {rates[0]} % loss",
        "",
        t3,
        "",
    ]
    errs = [c for c in summary if c["errors"] or c["seconds_with_nothing_received"]]
    if errs:
        md += ["## Errors and stalls", ""]
        for c in errs:
            bits = list(c["errors"])
            if c["seconds_with_nothing_received"]:
                bits.append(f"{c['seconds_with_nothing_received']} one-second intervals with nothing received "
                            "(summed over the repetitions)")
            md.append(f"- {label(c['variant'])}, {c['loss_pct']} % loss: " + "; ".join(bits))
        md.append("")
    md += [
        "## How to read this",
        "",
        "- Two namespaces joined by one veth pair; iperf3 server in A, one TCP stream sent by B. "
        "`plain TCP` is iperf3 over the veth itself (no tunnel, so no encryption cost either); "
        "the weft rows carry the same iperf3 through the tunnel (10.200.0.2 → 10.200.0.1), with both nodes "
        "listening on that one transport only, checked in `weft status --json` before and after each run.",
        "- Loss: nftables in each namespace drops the given fraction of the packets arriving on the veth "
        "(independent random drops, both directions). The veth's segmentation offloads and GRO are off so that "
        "every packet the filter sees is one wire packet; the 0 % column runs on the same underlay, so it is "
        "slower than bench/netns/compare.sh's direct figure.",
        "- Values are medians over the repetitions (repetitions outermost, then loss rates, then the rows). "
        "Mbit/s is iperf3's `end.sum_received`; retransmits are `end.sum_sent.retransmits` of the inner TCP "
        "(TCP-over-TCP transports also retransmit in the outer connection, which iperf3 does not see).",
        "- Per-run details (applied loss, seconds without data, weft drops and transport counters) are in "
        "results.json.",
        "",
    ]
    (out / "results.md").write_text("\n".join(md))
    print(t1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    for k in ("rep", "loss", "variant"):
        r.add_argument("--" + k, required=True)
    r.add_argument("--iperf")
    r.add_argument("--rc", default="0")
    r.add_argument("--counters", nargs=2)
    r.add_argument("--status", nargs=2)
    r.add_argument("--failed")
    r.add_argument("--note", default="")
    sub.add_parser("line")
    rp = sub.add_parser("report")
    rp.add_argument("--runs", required=True)
    rp.add_argument("--meta", required=True)
    rp.add_argument("--out", required=True)
    a = p.parse_args()
    {"record": cmd_record, "line": cmd_line, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
