"""bench_serving.py's picture of one run's latency distributions."""
from __future__ import annotations

import math


def plot(samples: dict[str, list[float]], summary: dict, path: str) -> None:
    """Histograms of TTFT, TPOT, ITL and E2E (seconds, by bench_serving.py's summary keys) with their p50/p95/p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (key, values) in zip(axes.flat, samples.items()):
        name = key.removesuffix("_s").upper()
        ms = [v * 1000 for v in values]
        if ms:
            ax.hist(ms, bins=min(40, max(5, len(ms) // 4)), color="#4a78b5")
        for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            v = summary[key][q]
            if math.isfinite(v):
                ax.axvline(v * 1000, color="#c44", linestyle=style, label=f"{q} {v * 1000:.1f} ms")
        ax.set_title(f"{name} ({len(ms)} samples)")
        ax.set_xlabel("ms")
        if ms:
            ax.legend(fontsize=8)
    fig.suptitle(f"{summary['completed']}/{summary['requests']} ok, {summary['request_throughput']:.2f} req/s, "
                 f"{summary['output_token_throughput']:.1f} tok/s, goodput {summary['goodput']:.2f} req/s "
                 f"(TTFT <= {summary['slo']['ttft_s']} s, TPOT <= {summary['slo']['tpot_s']} s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
