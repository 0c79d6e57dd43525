#!/usr/bin/env python3
"""Draws the benchmarks page's plots and writes its tables from the CSV
files scripts/bench-all leaves in docs/src/benchmarks/data/.

Usage: scripts/plot.py DATA_DIR PLOTS_DIR [PAGE]

PLOTS_DIR gets one SVG per plot. Each table is a Markdown table; in PAGE
(a Markdown file) the lines between `<!-- bench-all: NAME -->` and
`<!-- /bench-all -->` are replaced by table NAME, so the page's tables are
always those of the CSV files beside it; without PAGE the tables are
printed. DATA_DIR/machine.txt, when present, is table "machine" (as a
code block). A CSV file that is missing (a step not run) skips its plots
and tables, and leaves the page's block as it was. Needs matplotlib
(python3 -m pip install --user matplotlib).
"""

import csv
import os
import statistics
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

# Text stays text in the SVG (smaller files, searchable), and the files do
# not change from run to run but for the figures.
plt.rcParams["svg.fonttype"] = "none"
plt.rcParams["svg.hashsalt"] = "tollgate"
plt.rcParams["font.size"] = 10

# The services of the direct runs: (label, row) in scripts/bench.sh's CSV,
# and the name the page gives them, in the order they are drawn.
DIRECT = [
    ("null", "fixed_window/minute", "null service"),
    ("embedded", "fixed_window/minute", "tollgate, embedded"),
    ("new", "fixed_window leased", "tollgate, Redis, leased"),
    ("new", "fixed_window/minute", "tollgate, Redis"),
    ("lim-cached", "fixed_window/minute", "limitador, Redis, cached"),
    ("limitador", "fixed_window/minute", "limitador, Redis"),
]
ENVOY = [
    ("floor", "Envoy, no filter"),
    ("rlqs", "RLQS filter, tollgate embedded"),
    ("null", "null service"),
    ("memory", "tollgate, embedded"),
    ("leased", "tollgate, Redis, leased"),
    ("redis", "tollgate, Redis"),
    ("limitador", "limitador, Redis"),
]


def read(path):
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def fmt(x, digits=0):
    if x is None:
        return "-"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


def direct_series(rows):
    """{name: [(concurrency, row)]} of the direct runs."""
    out = {}
    for label, row, name in DIRECT:
        pts = [r for r in rows if r["label"] == label and r["row"] == row]
        pts.sort(key=lambda r: int(r["concurrency"]))
        if pts:
            out[name] = pts
    return out


def plot_direct(rows, plots):
    series = direct_series(rows)
    for field, scale, ylabel, name in [
        ("decisions_per_s", 1, "decisions per second", "direct-decisions.svg"),
        ("p99_us", 1e-3, "p99 latency (ms)", "direct-p99.svg"),
    ]:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for sname, pts in series.items():
            xs = [int(r["concurrency"]) for r in pts]
            ys = [num(r[field]) * scale for r in pts]
            ax.plot(xs, ys, marker="o", label=sname)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({int(r["concurrency"]) for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("calls in flight (closed loop, tollgate bench)")
        ax.set_ylabel(ylabel)
        if field == "p99_us":
            ax.set_yscale("log")
            ax.get_yaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_ylim(bottom=0 if field == "decisions_per_s" else None)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, os.path.join(plots, name))


def at(rows, label, row, c):
    for r in rows:
        if r["label"] == label and r["row"] == row and int(r["concurrency"]) == c:
            return r
    return None


def busiest(rows):
    """The concurrency the tables quote: 16 when measured, else the largest."""
    cs = sorted({int(r["concurrency"]) for r in rows})
    return 16 if 16 in cs else cs[-1]


def tables_direct(rows, tables):
    c = busiest(rows)
    null = at(rows, "null", "fixed_window/minute", c)
    lim = at(rows, "limitador", "fixed_window/minute", c)
    null_rate = num(null["decisions_per_s"]) if null else None
    lim_rate = num(lim["decisions_per_s"]) if lim else None
    out = []
    for label, row, name in DIRECT:
        r = at(rows, label, row, c)
        if not r:
            continue
        rate = num(r["decisions_per_s"])
        svc, rd = num(r["service_cpu_us"]), num(r["redis_cpu_us"])
        out.append([
            name,
            fmt(rate),
            fmt(rate / null_rate, 2) if null_rate else "-",
            fmt(rate / lim_rate, 2) if lim_rate else "-",
            fmt(num(r["p50_us"])),
            fmt(num(r["p99_us"])),
            fmt(svc, 1),
            fmt(rd, 1) if rd else "-",
            fmt(svc + rd, 1),
            f'{r["errors"]}',
        ])
    text = table(
        ["service", "decisions/s", "of null", "of limitador", "p50 µs", "p99 µs",
         "service CPU µs", "Redis CPU µs", "CPU µs, both", "errors"],
        out,
    )
    write(tables, "direct.md", text)

    # Every concurrency, decisions/s and p99 side by side.
    cs = sorted({int(r["concurrency"]) for r in rows})
    out = []
    for label, row, name in DIRECT:
        cells = [name]
        for cc in cs:
            r = at(rows, label, row, cc)
            cells.append(f'{fmt(num(r["decisions_per_s"]))} / {fmt(num(r["p99_us"]) / 1000, 1)}' if r else "-")
        out.append(cells)
    write(tables, "direct-sweep.md", table(["service"] + [f"{cc} in flight" for cc in cs], out))

    # Leased against unleased, at every concurrency.
    out = []
    for cc in cs:
        plain = at(rows, "new", "fixed_window/minute", cc)
        leased = at(rows, "new", "fixed_window leased", cc)
        lim = at(rows, "limitador", "fixed_window/minute", cc)
        cached = at(rows, "lim-cached", "fixed_window/minute", cc)
        if not (plain and leased):
            continue

        def cpu(r):
            return num(r["service_cpu_us"]) + num(r["redis_cpu_us"])

        out.append([
            str(cc),
            f'{fmt(num(leased["decisions_per_s"]))} / {fmt(num(plain["decisions_per_s"]))} = '
            f'**{num(leased["decisions_per_s"]) / num(plain["decisions_per_s"]):.2f}**',
            f'{fmt(num(leased["p99_us"]))} / {fmt(num(plain["p99_us"]))}',
            f'{fmt(cpu(leased), 1)} / {fmt(cpu(plain), 1)}',
            f'{fmt(num(leased["redis_calls_per_decision"]), 4)}',
            (f'{fmt(num(cached["decisions_per_s"]))} / {fmt(num(lim["decisions_per_s"]))} = '
             f'{num(cached["decisions_per_s"]) / num(lim["decisions_per_s"]):.2f}') if lim and cached else "-",
        ])
    write(tables, "leases.md", table(
        ["in flight", "tollgate decisions/s, leased / not", "p99 µs, leased / not",
         "CPU µs (tollgate + Redis), leased / not", "Redis calls per leased decision",
         "limitador decisions/s, cached / not"],
        out,
    ))


def plot_cpu(direct, envoy, plots):
    panels = [p for p in (direct, envoy) if p]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.2), squeeze=False)
    k = 0
    if direct:
        ax = axes[0][k]
        k += 1
        c = busiest(direct)
        names, svc, rd = [], [], []
        for label, row, name in DIRECT:
            r = at(direct, label, row, c)
            if r:
                names.append(name)
                svc.append(num(r["service_cpu_us"]))
                rd.append(num(r["redis_cpu_us"]))
        ax.barh(names, svc, label="the service")
        ax.barh(names, rd, left=svc, label="redis-server")
        ax.set_xlabel(f"CPU µs per decision (directly, {c} in flight)")
        ax.invert_yaxis()
        ax.legend(fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    if envoy:
        ax = axes[0][k]
        names, parts = [], {"front Envoy": [], "the service": [], "redis-server": []}
        for setup, name in ENVOY:
            rs = [r for r in envoy if r["setup"] == setup]
            if not rs:
                continue
            names.append(name)
            for key, field in [("front Envoy", "envoy_cpu_us"), ("the service", "service_cpu_us"),
                               ("redis-server", "redis_cpu_us")]:
                vals = [num(r[field]) for r in rs if num(r[field]) is not None]
                parts[key].append(statistics.median(vals) if vals else 0.0)
        left = [0.0] * len(names)
        for key, vals in parts.items():
            ax.barh(names, vals, left=left, label=key)
            left = [a + b for a, b in zip(left, vals)]
        ax.set_xlabel("CPU µs per request (through Envoy)")
        ax.invert_yaxis()
        ax.legend(fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    save(fig, os.path.join(plots, "cpu.svg"))


def tables_envoy(rows, tables):
    rounds = sorted({r["round"] for r in rows})
    by = {(r["setup"], r["round"]): r for r in rows}
    out = []
    for setup, name in ENVOY:
        rs = [by[(setup, k)] for k in rounds if (setup, k) in by]
        if not rs:
            continue

        def med(field, rs=rs):
            vals = [num(r[field]) for r in rs if num(r[field]) is not None]
            return statistics.median(vals) if vals else None

        of_null = [num(by[(setup, k)]["requests_per_s"]) / num(by[("null", k)]["requests_per_s"])
                   for k in rounds if (setup, k) in by and ("null", k) in by]
        of_floor = [num(by[(setup, k)]["requests_per_s"]) / num(by[("floor", k)]["requests_per_s"])
                    for k in rounds if (setup, k) in by and ("floor", k) in by]

        def span(xs):
            if not xs:
                return "-"
            lo, hi = min(xs), max(xs)
            return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"

        out.append([
            name, fmt(med("requests_per_s")), span(of_floor), span(of_null),
            fmt(med("p50_ms"), 2), fmt(med("p99_ms"), 2),
            fmt(med("envoy_cpu_us"), 1), fmt(med("service_cpu_us"), 1), fmt(med("redis_cpu_us"), 1),
        ])
    write(tables, "envoy.md", table(
        ["set-up", "requests/s", "of no filter", "of null", "p50 ms", "p99 ms",
         "Envoy CPU µs", "service CPU µs", "Redis CPU µs"],
        out,
    ))


def tables_features(rows, tables):
    def get(label, row):
        for r in rows:
            if r["label"] == label and r["row"] == row:
                return r
        return None

    def line(what, r, base, base_name):
        if not r:
            return None
        rate = num(r["decisions_per_s"])
        cells = [what, fmt(rate)]
        if base:
            cells.append(f'**{rate / num(base["decisions_per_s"]):.2f}** of {base_name}')
        else:
            cells.append("-")
        cells += [fmt(num(r["p99_us"])), fmt(num(r["service_cpu_us"]), 1),
                  fmt(num(r["redis_cpu_us"]), 1) if num(r["redis_cpu_us"]) else "-",
                  fmt(num(r["redis_calls_per_decision"]), 2)]
        return cells

    fw = get("new", "fixed_window")
    out = [line("fixed window (the base)", fw, None, "")]
    for a in ["sliding_window_counter", "sliding_window_log", "token_bucket"]:
        out.append(line(f"`{a}`", get("new", a), fw, "fixed window"))
    for a in ["fixed_window", "sliding_window_counter", "sliding_window_log", "token_bucket"]:
        out.append(line(f"`{a}`, a second limit on the descriptor", get("new", f"{a} x2"),
                        get("new", a), "one limit"))
    out.append(line("metrics off (`metrics.enabled: false`)", get("no-metrics", "fixed_window"), fw,
                    "metrics on"))
    out.append(line("embedded store instead of Redis", get("embedded", "fixed_window"), fw, "Redis"))
    out.append(line("a descriptor no rule matches (no store call)", get("new", "no_rule"), fw,
                    "fixed window"))
    write(tables, "features.md", table(
        ["feature (tollgate on Redis unless named)", "decisions/s", "ratio", "p99 µs",
         "tollgate CPU µs", "Redis CPU µs", "Redis calls per decision"],
        [r for r in out if r],
    ))
    # Against Redis running the same script directly.
    out = []
    for a in ["fixed_window", "sliding_window_counter", "sliding_window_log", "token_bucket"]:
        r = get("new", a)
        if not r or not num(r["rb_calls_per_s"]):
            continue
        rate, rb = num(r["decisions_per_s"]), num(r["rb_calls_per_s"])
        out.append([f"`{a}`", fmt(rate), fmt(rb), f"**{rate / rb:.2f}**",
                    fmt(num(r["redis_cpu_us"]), 1), fmt(num(r["rb_cpu_us"]), 1)])
    write(tables, "redis-ceiling.md", table(
        ["algorithm", "tollgate decisions/s", "redis-benchmark calls/s", "ratio",
         "Redis CPU µs per decision (tollgate)", "Redis CPU µs per call (redis-benchmark)"],
        out,
    ))


def phases(rows):
    """Splits the timeline at its events: [(name, rows)]."""
    names = {"": "before", "reshard of": "during the reshard", "reshard done": "after the reshard",
             "primary killed": "the first 5 s after a primary dies"}
    out, cur, name = [], [], "before"
    killed_at = None
    for r in rows:
        ev = r["event"]
        if ev:
            if cur:
                out.append((name, cur))
            cur = []
            name = next((v for k, v in names.items() if k and ev.startswith(k)), ev)
            if ev.startswith("primary killed"):
                killed_at = num(r["t_s"])
        if killed_at is not None and name.startswith("the first") and num(r["t_s"]) > killed_at + 5:
            out.append((name, cur))
            cur, name = [], "after the failover"
        cur.append(r)
    if cur:
        out.append((name, cur))
    return out


def faults(rows, plots, tables):
    t = [num(r["t_s"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7.2, 4.0))
    ax.plot(t, [num(r["admitted_per_s"]) for r in rows], marker=".", label="admitted (OK)")
    ax.plot(t, [num(r["errors_per_s"]) for r in rows], marker=".", label="errors (UNAVAILABLE)")
    limit = num(rows[0]["limit_per_s"])
    ax.axhline(limit, color="grey", linestyle="--", linewidth=1, label=f"the limits' sum ({limit:,.0f}/s)")
    for r in rows:
        if r["event"]:
            x = num(r["t_s"]) - 1
            ax.axvline(x, color="black", linewidth=0.8, alpha=0.6)
            ax.annotate(r["event"], (x, ax.get_ylim()[1]), rotation=90, fontsize=7,
                        va="top", ha="right")
    ax.set_xlabel("seconds")
    ax.set_ylabel("answers per second")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center left")
    save(fig, os.path.join(plots, "faults.svg"))
    out = []
    for name, rs in phases(rows):
        adm = [num(r["admitted_per_s"]) for r in rs]
        err = [num(r["errors_per_s"]) for r in rs]
        p99 = [num(r["p99_us"]) for r in rs]
        out.append([name, str(len(rs)), fmt(statistics.median(adm)), f"{fmt(min(adm))}-{fmt(max(adm))}",
                    f"{max(adm) / limit:.2f}", fmt(sum(err)), fmt(max(p99) / 1000, 1)])
    write(tables, "faults.md", table(
        ["phase", "seconds", "admitted/s, median", "admitted/s, range", "most admitted / limits' sum",
         "error answers (sum of the seconds)", "worst p99 ms"],
        out,
    ))


def write(tables, name, text):
    tables[name.removesuffix(".md")] = text


def fill(page, tables):
    """Replaces each marked block of PAGE by its table."""
    with open(page) as f:
        lines = f.read().split("\n")
    out, name = [], None
    for line in lines:
        if name is None:
            out.append(line)
            if line.startswith("<!-- bench-all: ") and line.endswith(" -->"):
                name = line[len("<!-- bench-all: "):-len(" -->")]
                if name in tables:
                    out.append(tables[name].rstrip("\n"))
                else:
                    name = ""  # keep the old block
        elif line == "<!-- /bench-all -->":
            out.append(line)
            name = None
        elif name == "":
            out.append(line)
    with open(page, "w") as f:
        f.write("\n".join(out))
    print(f"wrote the tables into {page}", file=sys.stderr)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    data, plots = sys.argv[1], sys.argv[2]
    page = sys.argv[3] if len(sys.argv) == 4 else None
    os.makedirs(plots, exist_ok=True)
    tables = {}
    machine = os.path.join(data, "machine.txt")
    if os.path.exists(machine):
        with open(machine) as f:
            tables["machine"] = "```text\n" + f.read().rstrip("\n") + "\n```\n"
    direct = read(os.path.join(data, "direct.csv"))
    envoy = read(os.path.join(data, "envoy.csv"))
    features = read(os.path.join(data, "features.csv"))
    timeline = read(os.path.join(data, "faults.csv"))
    if direct:
        plot_direct(direct, plots)
        tables_direct(direct, tables)
    if envoy:
        tables_envoy(envoy, tables)
    plot_cpu(direct, envoy, plots)
    if features:
        tables_features(features, tables)
    if timeline:
        faults(timeline, plots, tables)
    if page:
        fill(page, tables)
    else:
        for name, text in tables.items():
            print(f"<!-- {name} -->\n{text}")


if __name__ == "__main__":
    main()
