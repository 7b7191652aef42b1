"""The roofline PNG: each chip's roof (bandwidth slope, then the compute ceiling) on log-log axes, the
modelled steps on their roof, and measured runs as stars under the CPU's."""
from __future__ import annotations

import numpy as np

COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:purple"]


def plot_roofline(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    steps, measured = report["steps"], report["measured"]
    lo = min([s["intensity"] for s in steps] + [p["intensity"] for p in measured]) / 2
    hi = max([s["intensity"] for s in steps] + [c["ridge"] for c in report["chips"]]) * 4
    x = np.geomspace(lo, hi, 200)
    labelled: set[int] = set()  # steps are labelled on the first roof of each dtype only: the rest repeat them
    for color, chip in zip(COLORS, report["chips"]):
        label_steps = chip["dtype_bytes"] not in labelled
        labelled.add(chip["dtype_bytes"])
        ax.plot(x, np.minimum(chip["peak_flops"], x * chip["bandwidth"]), color=color,
                label=f"{chip['name']} ({chip['peak_flops'] / 1e12:.3g} TFLOP/s, {chip['bandwidth'] / 1e9:.0f} GB/s)")
        for j, s in enumerate(s for s in steps if s["chip"] == chip["name"]):
            y = min(chip["peak_flops"], s["intensity"] * chip["bandwidth"])
            ax.plot(s["intensity"], y, "o" if s["label"].startswith("decode") else "s", color=color, ms=5)
            if label_steps:
                ax.annotate(s["label"], (s["intensity"], y), fontsize=6, xytext=(3, -9 - 8 * (j % 2)),
                            textcoords="offset points")  # alternate heights: neighbours on a roof overlap
    for i, p in enumerate(measured):  # runs sit close together: their labels stack in a column
        ax.plot(p["intensity"], p["flops_per_s"], "*", color="tab:red", ms=10)
        ax.annotate(p["label"], (p["intensity"], p["flops_per_s"]), fontsize=6, color="tab:red",
                    xytext=(0.42, 0.13 - 0.03 * i), textcoords="axes fraction",
                    arrowprops={"arrowstyle": "-", "color": "tab:red", "lw": 0.4})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"{report['model']}: prefill (squares), decode (circles), measured runs (stars)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
