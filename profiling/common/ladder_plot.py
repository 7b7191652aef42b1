"""The optimization ladder's PNG: output tok/s per rung (speed-up over rung 1 on each bar), and KV
reserved vs holding tokens (waste on each pair)."""
from __future__ import annotations

import textwrap


def plot_ladder(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rungs"]
    x = list(range(len(rows)))
    labels = [textwrap.fill(r["rung"], 16) for r in rows]
    ran = [r for r in rows if "output_tok_s" in r]
    fig, (speed, kv) = plt.subplots(1, 2, figsize=(13, 4.5))
    speed.bar(x, [r.get("output_tok_s", 0) for r in rows], color="tab:blue")
    top = max(r["output_tok_s"] for r in ran)
    for i, r in enumerate(rows):
        text = f"{r['speedup']:.2f}x" if "speedup" in r else "n/a"
        speed.text(i, r.get("output_tok_s", 0) + top * 0.01, text, ha="center", va="bottom", fontsize=9)
    speed.set_ylabel("output tok/s")
    speed.set_title(f"{report['model']}: {report['workload']['requests']} requests, batch {report['max_num_seqs']}")
    w = 0.4
    kv.bar([i - w / 2 for i in x], [r.get("kv_reserved_mib", 0) for r in rows], w, label="reserved", color="tab:orange")
    kv.bar([i + w / 2 for i in x], [r.get("kv_held_mib", 0) for r in rows], w, label="holding tokens", color="tab:green")
    peak = max(r["kv_reserved_mib"] for r in ran)
    for i, r in enumerate(rows):
        text = f"waste {r['kv_waste']:.0%}" if "kv_waste" in r else "n/a"
        kv.text(i, r.get("kv_reserved_mib", 0) + peak * 0.01, text, ha="center", va="bottom", fontsize=9)
    kv.set_ylabel("KV MiB (time-averaged)")
    kv.set_title("KV memory reserved vs holding tokens")
    kv.legend()
    for ax in (speed, kv):
        ax.set_xticks(x, labels, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
