#!/usr/bin/python3
"""Summarise hpctrain run directories, plot their curves, export their metrics as CSV.

    hpctrain report RUN_DIR... [--plot OUT.png] [--csv [FILE]] [--smooth STEPS] [--verbose]

(`hpctrain report` runs this script; it also runs on its own.) Reads RUN_DIR/metrics.h5 (and checkpoints/) of each
run: prints the steps, the final training loss, the evaluation metrics, the median samples/s, skipped steps and the
checkpoints. --plot writes one PNG with a panel each for the training loss (raw and smoothed, with the evaluation
loss), the evaluation metrics, the learning rate, the loss scale, the gradient norm and the throughput; several runs
share the panels, one colour each. --csv writes the /train table with /eval joined by step (layout in
docs/file-formats.md). Needs Debian's python3-h5py, python3-numpy and python3-matplotlib (tools/install-deps.sh
installs them; in a virtual environment: pip install h5py numpy matplotlib).
"""
import argparse
import csv
import math
import os
import sys
import textwrap

import h5py
import numpy as np

PROG = "hpctrain report"
USAGE = f"{PROG} RUN_DIR... [--plot OUT.png] [--csv [FILE]] [--smooth STEPS] [--verbose]"
TRAIN_COLUMNS = ("step", "loss", "lr", "samples_per_sec", "grad_norm", "loss_scale", "skipped")
EVAL_COLUMNS = ("loss", "accuracy", "top5_accuracy", "mae", "mse", "r2")
# Evaluation metrics grouped by scale: each group gets its own y axis in the evaluation panel.
EVAL_GROUPS = (("accuracy", ("accuracy", "top5_accuracy"), "accuracy (fraction correct)"),
               ("error", ("mae", "mse"), "error (mae, mse)"),
               ("r2", ("r2",), "R² (coefficient of determination)"))
EVAL_STYLES = {"accuracy": dict(marker="o", ls="-"), "top5_accuracy": dict(marker="s", ls=":"),
               "mae": dict(marker="o", ls="-"), "mse": dict(marker="s", ls="--"), "r2": dict(marker="^", ls=":")}
EVAL_NAMES = {"accuracy": "accuracy", "top5_accuracy": "top-5 accuracy", "mae": "mae", "mse": "mse", "r2": "R²"}


def input_error(message):
    """Bad input (a missing run, a file that is not metrics.h5): exit status 2, as for hpctrain's own input errors."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def load(run_dir):
    """{"train": {column: array}, "eval": {...}, "attrs": {...}} of RUN_DIR/metrics.h5; columns of a group cut to
    the shortest (a run that is still writing may be one column ahead)."""
    path = os.path.join(run_dir, "metrics.h5")
    if not os.path.exists(path):
        input_error(f"{path} does not exist (is {run_dir} a run directory?)")
    try:
        with h5py.File(path, "r") as f:
            metrics = {"attrs": {name: f.attrs[name] for name in f.attrs}}
            for group in ("train", "eval"):
                if isinstance(f.get(group), h5py.Group):
                    columns = {name: f[group][name][()] for name in f[group] if isinstance(f[group][name], h5py.Dataset)}
                    rows = min((len(values) for values in columns.values()), default=0)
                    metrics[group] = {name: values[:rows] for name, values in columns.items()}
    except OSError as error:
        input_error(f"{path} cannot be read as HDF5 ({error})")
    return metrics


def run_names(run_dirs):
    """Each run's name: its directory's name, or the path as given where two runs' directories share a name."""
    names = [os.path.basename(os.path.abspath(run_dir)) for run_dir in run_dirs]
    return [name if names.count(name) == 1 else os.path.normpath(run_dir) for name, run_dir in zip(names, run_dirs)]


def summary(run_dir, metrics):
    train, evaluation = metrics.get("train", {}), metrics.get("eval", {})
    lines = [f"run: {os.path.abspath(run_dir)}"]
    steps = train.get("step", np.array([]))
    if len(steps) == 0:
        return "\n".join(lines + ["no training steps recorded"])
    rates = train.get("samples_per_sec", np.full(len(steps), np.nan))[len(steps) // 10:]  # leave out the warm-up
    lines.append(f"steps: {int(steps[-1])}; final training loss {train['loss'][-1]:.6g}; "
                 f"median {np.median(rates):.0f} samples/s; skipped steps {int(train.get('skipped', steps * 0).sum())}")
    if len(evaluation.get("step", [])):
        values = ", ".join(f"{name} {evaluation[name][-1]:.6g}" for name in sorted(evaluation) if name != "step")
        lines.append(f"evaluation at step {int(evaluation['step'][-1])}: {values}")
    checkpoints = os.path.join(run_dir, "checkpoints")
    if os.path.isdir(checkpoints):
        files = sorted(name for name in os.listdir(checkpoints) if name.endswith(".h5"))
        lines.append(f"checkpoints: {', '.join(files) if files else 'none'}")
    return "\n".join(lines)


# --- CSV ---

def ordered(names, canonical):
    return [name for name in canonical if name in names] + sorted(set(names) - set(canonical))


def csv_value(values, row):
    if values is None or row is None:
        return ""
    value = values[row]
    return str(int(value)) if np.issubdtype(values.dtype, np.integer) else repr(float(value))


def write_csv(names, runs, out):
    """One row per step of each run: run, the /train columns, then eval_<metric> for the steps that were evaluated
    (empty elsewhere). A step with an evaluation but no /train row keeps its train columns empty."""
    train_columns = ordered({name for metrics in runs for name in metrics.get("train", {})}, TRAIN_COLUMNS)
    train_columns = ["step"] + [name for name in train_columns if name != "step"]
    eval_columns = ordered({name for metrics in runs for name in metrics.get("eval", {}) if name != "step"},
                           EVAL_COLUMNS)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["run"] + train_columns + [f"eval_{name}" for name in eval_columns])
    for name, metrics in zip(names, runs):
        train, evaluation = metrics.get("train", {}), metrics.get("eval", {})
        train_rows = {int(step): row for row, step in enumerate(train.get("step", []))}
        eval_rows = {int(step): row for row, step in enumerate(evaluation.get("step", []))}
        for step in sorted(train_rows.keys() | eval_rows.keys()):
            row, eval_row = train_rows.get(step), eval_rows.get(step)
            writer.writerow([name, step] + [csv_value(train.get(column), row) for column in train_columns[1:]] +
                            [csv_value(evaluation.get(column), eval_row) for column in eval_columns])


# --- plot ---

def exponential_moving_average(values, span):
    """Bias-corrected EMA with alpha = 2 / (span + 1) (pandas' ewm(span=...), adjust=True); non-finite values are
    left out."""
    alpha = 2.0 / (span + 1.0)
    smoothed, total, weight = np.full(len(values), np.nan), 0.0, 0.0
    for i, value in enumerate(values):
        if math.isfinite(value):
            total = (1.0 - alpha) * total + alpha * value
            weight = (1.0 - alpha) * weight + alpha
        if weight > 0.0:
            smoothed[i] = total / weight
    return smoothed


def default_span(runs):
    longest = max((len(metrics.get("train", {}).get("step", [])) for metrics in runs), default=0)
    return int(min(200, max(5, longest // 20)))


def log_scale_if_positive(axis, arrays):
    values = np.concatenate([np.asarray(a, dtype=float) for a in arrays]) if arrays else np.array([])
    values = values[np.isfinite(values)]
    if len(values) and np.all(values > 0) and values.max() > 10 * values.min():  # a decade or more
        axis.set_yscale("log")


def plot(names, runs, out, span):
    """Draw the figure; returns [(panel name, axis)] of every y axis drawn (twins included), for --verbose."""
    import matplotlib
    matplotlib.use("Agg")  # no display on compute nodes
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colours = [f"C{i % 10}" for i in range(len(runs))]
    single = len(runs) == 1

    def key(label, **style):  # a legend entry for a line style: in the run's colour, or grey when runs share a panel
        return Line2D([], [], color=colours[0] if single else "0.35", label=label, **style)

    figure, grid = plt.subplots(3, 2, figsize=(13, 11), constrained_layout=True)
    (loss_axis, eval_axis), (lr_axis, scale_axis), (norm_axis, rate_axis) = grid
    panels = []
    trains = [metrics.get("train", {}) for metrics in runs]
    evaluations = [metrics.get("eval", {}) for metrics in runs]

    # Training loss: raw (faint), smoothed, and the evaluation loss.
    has_eval_loss = False
    for name, colour, train, evaluation in zip(names, colours, trains, evaluations):
        if len(train.get("loss", [])):
            loss_axis.plot(train["step"], train["loss"], color=colour, lw=0.6, alpha=0.3,
                           label=f"{name}: training loss (raw)")
            if span > 1:
                loss_axis.plot(train["step"], exponential_moving_average(train["loss"], span), color=colour, lw=1.6,
                               label=f"{name}: training loss (EMA over {span} steps)")
        if len(evaluation.get("loss", [])):
            has_eval_loss = True
            loss_axis.plot(evaluation["step"], evaluation["loss"], color=colour, marker="o", ms=4, ls="--", lw=1,
                           label=f"{name}: evaluation loss")
    log_scale_if_positive(loss_axis, [train.get("loss", []) for train in trains] +
                          [evaluation.get("loss", []) for evaluation in evaluations])
    entries = [key("training loss (raw)", lw=0.6, alpha=0.3)]
    if span > 1:
        entries.append(key(f"training loss (EMA over {span} steps)", lw=1.6))
    if has_eval_loss:
        entries.append(key("evaluation loss", marker="o", ms=4, ls="--", lw=1))
    loss_axis.legend(handles=entries, fontsize="small")
    loss_axis.set_title("training loss")
    loss_axis.set_ylabel("loss")
    panels.append(("training loss", loss_axis))

    # Evaluation metrics: one y axis per scale (accuracies; mae and mse; R²).
    eval_axis.set_title("evaluation metrics")
    groups = [(group, [metric for metric in metrics if any(len(e.get(metric, [])) for e in evaluations)], label)
              for group, metrics, label in EVAL_GROUPS]
    groups = [(group, metrics, label) for group, metrics, label in groups if metrics]
    if not groups:
        eval_axis.set_ylabel("evaluation metric")
        eval_axis.text(0.5, 0.5, "no evaluations recorded", ha="center", va="center", transform=eval_axis.transAxes)
        panels.append(("evaluation metrics", eval_axis))
    entries = []
    for index, (group, metrics, label) in enumerate(groups):
        axis = eval_axis if index == 0 else eval_axis.twinx()
        where = ("", " (right axis)", " (far right axis)")[index]
        if index == 2:
            axis.spines["right"].set_position(("axes", 1.15))
        for metric in metrics:
            for name, colour, evaluation in zip(names, colours, evaluations):
                if len(evaluation.get(metric, [])):
                    axis.plot(evaluation["step"], evaluation[metric], color=colour, ms=4, **EVAL_STYLES[metric],
                              label=f"{name}: {EVAL_NAMES[metric]}")
            entries.append(key(EVAL_NAMES[metric] + where, ms=4, **EVAL_STYLES[metric]))
        if group == "accuracy":
            axis.set_ylim(-0.02, 1.02)
        axis.set_ylabel(label)
        panels.append(("evaluation metrics" + where, axis))
    if entries:
        eval_axis.legend(handles=entries, fontsize="small")

    # Learning rate, loss scale (skipped steps marked), gradient norm, throughput.
    skipped_any = False
    for name, colour, train in zip(names, colours, trains):
        if len(train.get("lr", [])):
            lr_axis.plot(train["step"], train["lr"], color=colour, label=f"{name}: learning rate")
        if len(train.get("loss_scale", [])):
            scale_axis.plot(train["step"], train["loss_scale"], color=colour, label=f"{name}: loss scale")
            skipped = train.get("skipped", np.zeros(0)) > 0
            if skipped.any():
                skipped_any = True
                scale_axis.plot(train["step"][skipped], train["loss_scale"][skipped], "x", color=colour, ms=6,
                                mew=1.5, label=f"{name}: skipped step")
        if len(train.get("grad_norm", [])):
            norm_axis.plot(train["step"], train["grad_norm"], color=colour, lw=0.8, label=f"{name}: gradient norm")
        if len(train.get("samples_per_sec", [])):
            rate_axis.plot(train["step"], train["samples_per_sec"], color=colour, lw=0.8,
                           label=f"{name}: samples/s")
    lr_axis.set_title("learning rate")
    lr_axis.set_ylabel("learning rate")
    scale_axis.set_title("loss scale")
    scale_axis.set_ylabel("loss scale")
    log_scale_if_positive(scale_axis, [train.get("loss_scale", []) for train in trains])
    if skipped_any:
        scale_axis.legend(handles=[key("skipped step (non-finite gradients)", marker="x", ls="", ms=6, mew=1.5)],
                          fontsize="small")
    norm_axis.set_title("gradient norm")
    norm_axis.set_ylabel("global L2 norm before clipping")
    log_scale_if_positive(norm_axis, [train.get("grad_norm", []) for train in trains])
    rate_axis.set_title("throughput")
    rate_axis.set_ylabel("samples/s")
    rate_axis.set_ylim(bottom=0)
    panels += [("learning rate", lr_axis), ("loss scale", scale_axis), ("gradient norm", norm_axis),
               ("throughput", rate_axis)]

    for axis in grid.flat:
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    title = textwrap.wrap(", ".join(names), 110)
    top = 0.012 + 0.022 * len(title)  # the title's share of the height, above the panels
    if not single:  # the runs' legend between the title and the panels
        rows = (len(names) + 5) // 6
        figure.legend(handles=[Line2D([], [], color=colour, lw=2, label=name) for name, colour in zip(names, colours)],
                      loc="upper center", bbox_to_anchor=(0.5, 1 - top), ncols=min(len(names), 6), frameon=False)
        top += 0.01 + 0.025 * rows
    figure.get_layout_engine().set(rect=(0, 0, 1, 1 - top))
    figure.text(0.5, 0.995, "\n".join(title), ha="center", va="top", fontsize="large", fontweight="bold")
    try:
        figure.savefig(out, dpi=100)
    except OSError as error:
        input_error(f"--plot {out}: cannot write ({error.strerror or error})")
    return figure, panels


def describe_plot(figure, panels):
    """What the figure shows, read back from matplotlib: the title, the runs' legend, each panel's labels and lines."""
    lines = [f"  title: {' '.join(text.get_text().replace(chr(10), ' ') for text in figure.texts)}"]
    for legend in figure.legends:
        lines.append(f"  legend: {', '.join(text.get_text() for text in legend.get_texts())}")
    for name, axis in panels:
        scale = f" ({axis.get_yscale()} scale)" if axis.get_yscale() != "linear" else ""
        labels = [line.get_label() for line in axis.get_lines() if not line.get_label().startswith("_")]
        x_label = f"x label '{axis.get_xlabel()}'" if axis.get_xlabel() else "x shared"
        lines.append(f"  panel {name}: {x_label}, y label '{axis.get_ylabel()}'{scale}; "
                     f"lines: {'; '.join(labels) if labels else 'none'}")
    return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        input_error(f"{message} (see '{PROG} --help')")


def main():
    parser = Parser(
        prog=PROG, usage=USAGE,
        description="Summarise hpctrain runs (RUN_DIR/metrics.h5 and checkpoints/), plot their curves, export their "
                    "metrics as CSV. The layout of metrics.h5 and of the CSV is in docs/file-formats.md.",
        epilog="With --csv to standard output, standard output holds only the CSV; the summaries go to standard error. "
               "Put --csv after the run directories (or write --csv -), since --csv takes the next word as FILE.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (hpctrain train --output)")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="write one PNG: training loss (raw and smoothed) with the evaluation loss, evaluation "
                             "metrics, learning rate, loss scale, gradient norm, throughput; several runs share the "
                             "panels, one colour each")
    parser.add_argument("--csv", nargs="?", const="-", metavar="FILE",
                        help="write the metrics as CSV to FILE (default: standard output): one row per step, a run "
                             "column, the /train columns, eval_<metric> columns on evaluated steps")
    parser.add_argument("--smooth", type=int, metavar="STEPS",
                        help="span of the exponential moving average of the training loss in the plot (alpha = "
                             "2 / (STEPS + 1)); default: a 20th of the longest run's steps, 5 to 200; 1 = no smoothing")
    parser.add_argument("--verbose", action="store_true",
                        help="also print what the plot shows: title, legend, each panel's axis labels and lines")
    arguments = parser.parse_args()
    if arguments.smooth is not None and arguments.smooth < 1:
        input_error(f"--smooth {arguments.smooth}: the span is a number of steps >= 1")
    runs = [load(run_dir) for run_dir in arguments.run_dirs]
    names = run_names(arguments.run_dirs)
    # Standard output holds only the CSV when it goes there.
    info = sys.stderr if arguments.csv == "-" else sys.stdout
    print("\n\n".join(summary(run_dir, metrics) for run_dir, metrics in zip(arguments.run_dirs, runs)), file=info)
    if arguments.plot:
        if not any(len(metrics.get("train", {}).get("step", [])) for metrics in runs):
            input_error("--plot: no training steps recorded, nothing to plot")
        figure, panels = plot(names, runs, arguments.plot,
                              arguments.smooth if arguments.smooth is not None else default_span(runs))
        print(f"plot: {arguments.plot}", file=info)
        if arguments.verbose:
            print(describe_plot(figure, panels), file=info)
    if arguments.csv == "-":
        write_csv(names, runs, sys.stdout)
    elif arguments.csv:
        try:
            with open(arguments.csv, "w", newline="") as out:
                write_csv(names, runs, out)
        except OSError as error:
            input_error(f"--csv {arguments.csv}: cannot write ({error.strerror or error})")
        print(f"csv: {arguments.csv}", file=info)


if __name__ == "__main__":
    main()
