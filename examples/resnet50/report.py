"""The results of a run: a text table, a JSON file and a PNG of the curves.

Two throughputs, named apart, since they differ by the first step's compile: "steady" is the global
batch over the median step time (the first steps left out), the figure benchmarks compare; "bar" is
what the progress bar's ``samples_per_sec`` showed at the end of an epoch, the epoch's images over
the seconds since it began, so the first epoch's includes the compile.
"""

from __future__ import annotations

import json
import os


def _rows(results: dict) -> list[tuple[str, str]]:
    rows = [("mode", results["mode"]), ("data", str(results.get("data"))), ("oneDNN", str(results.get("onednn")))]
    tr = results.get("train")
    if tr:
        rows += [
            ("ranks", str(tr["num_workers"])), ("global batch", str(tr["global_batch"])),
            ("throughput, steady", f"{tr['img_per_sec']:.2f} img/s (median step)"),
            ("step time", f"{tr['step_time_s']:.3f} s (median)"),
        ]
        bar = tr.get("bar_img_per_sec") or []
        if bar:
            rows.append(("throughput, bar epoch 1", f"{bar[0]:.2f} img/s (with compile)"))
        if len(bar) > 1:
            rows.append((f"throughput, bar epoch {len(bar)}", f"{bar[-1]:.2f} img/s"))
        rows += [
            ("allreduce share", f"{tr['allreduce_share']:.1%}"), ("steps", str(tr["steps"])),
            ("startup", f"{tr['startup_s']:.1f} s" if tr.get("startup_s") else "n/a"),
            ("training wall time", f"{tr['wall_s']:.1f} s"),
        ]
        if "scaling_efficiency" in tr:
            rows += [("1-rank throughput", f"{tr['img_per_sec_1_rank']:.2f} img/s"),
                     ("scaling efficiency", f"{tr['scaling_efficiency']:.3f}")]
    ev = results.get("evaluate")
    if ev:
        rows += [("top-1", f"{ev['top1']:.4f}"), ("top-5", f"{ev['top5']:.4f}"), ("evaluated images", str(ev["images"]))]
    inf = results.get("inference")
    if inf:
        rows += [("inference (TensorFlow)", f"{inf['img_per_sec']:.2f} img/s at batch {inf['batch']}")]
    ov = results.get("inference_openvino")
    if ov:
        rows += [("inference (OpenVINO)", f"{ov['img_per_sec']:.2f} img/s")]
    cmp_ = results.get("compare")
    if cmp_:
        rows += [("tfnet fine-tuning, steady", f"{cmp_['tfnet']['img_per_sec']:.2f} img/s (median step)"),
                 ("Keras fit, steady", f"{cmp_['keras_fit']['img_per_sec']:.2f} img/s (median step)"),
                 ("tfnet / Keras", f"{cmp_['ratio']:.2f}"),
                 ("loss per epoch, tfnet", ", ".join(f"{v:.5f}" for v in cmp_["tfnet"]["loss"])),
                 ("loss per epoch, Keras fit", ", ".join(f"{v:.5f}" for v in cmp_["keras_fit"]["loss"])),
                 ("loss, largest rel. difference", f"{cmp_['loss_rel_diff']:.2e}")]
    rows.append(("wall time", f"{results['wall_s']:.1f} s"))
    return rows


def table(results: dict) -> str:
    rows = _rows(results)
    width = max(len(k) for k, _ in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * 34 + "+"
    out = [line] + [f"| {k.ljust(width)} | {v[:32].ljust(32)} |" for k, v in rows] + [line]
    if any(k.startswith("throughput, bar") for k, _ in rows):
        out.append("steady: global batch / median step time, the first steps left out. bar: the progress bar's\n"
                   "samples_per_sec at the epoch's end, its images / the seconds since it began (epoch 1: with the\n"
                   "first step's compile).")
    return "\n".join(out)


def plot(results: dict, path: str) -> str | None:
    """Loss and accuracy per epoch, and throughput per step. None when there is nothing to plot, or
    when matplotlib (the ``examples`` extra; the cluster image leaves it out) is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = (results.get("train") or {}).get("history") or {}
    steps = (results.get("train") or {}).get("step_times") or []
    cmp_ = results.get("compare")
    if not history and not steps and not cmp_:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    for key in ("loss", "val_loss"):
        if key in history:
            ax.plot(range(1, len(history[key]) + 1), history[key], marker="o", label=key)
    if cmp_:
        ax.plot(range(1, len(cmp_["tfnet"]["loss"]) + 1), cmp_["tfnet"]["loss"], marker="o", label="tfnet loss")
        ax.plot(range(1, len(cmp_["keras_fit"]["loss"]) + 1), cmp_["keras_fit"]["loss"], marker="x", label="Keras loss")
    ax.set_xlabel("epoch")
    ax.set_title("loss")
    ax.legend()
    ax = axes[1]
    for key in ("accuracy", "top5_accuracy", "val_accuracy"):
        if key in history:
            ax.plot(range(1, len(history[key]) + 1), history[key], marker="o", label=key)
    ax.set_xlabel("epoch")
    ax.set_title("accuracy")
    if ax.lines:
        ax.legend()
    ax = axes[2]
    batch = (results.get("train") or {}).get("global_batch")
    if steps and batch:
        ax.plot(range(1, len(steps) + 1), [batch / t if t else None for t in steps], label="tfnet")
    if cmp_:
        b = cmp_["batch"]
        for name, times in cmp_["step_times"].items():
            ax.plot(range(1, len(times) + 1), [b / t if t else None for t in times], label=name)
    ax.set_xlabel("step")
    ax.set_title("throughput per step (img/s)")
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_results(results: dict, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    text = table(results)
    with open(os.path.join(folder, "results.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=float)
    png = plot(results, os.path.join(folder, "curves.png"))
    if png:
        text += f"\nwrote {folder}/results.txt, results.json and curves.png"
    else:
        text += f"\nwrote {folder}/results.txt and results.json (no curves.png: nothing to plot, or no matplotlib)"
    return text
