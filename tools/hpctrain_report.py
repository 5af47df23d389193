#!/usr/bin/python3
"""Summarise an hpctrain run directory and plot its training curves.

    tools/hpctrain_report.py RUN_DIR [--plot OUT.png]

Reads RUN_DIR/metrics.h5 (and config.toml, checkpoints/): prints the steps, the final training loss, the evaluation
metrics, the median samples/s, skipped steps and the checkpoints; with --plot writes one PNG with the training loss,
the evaluation metrics, the learning rate and the loss scale against the step. Needs Debian's python3-h5py,
python3-numpy and python3-matplotlib (tools/install-deps.sh installs them).
"""
import argparse
import os
import sys

import h5py
import numpy as np


def input_error(message):
    """Bad input (a missing run, a file that is not metrics.h5): exit status 2, as for hpctrain's own input errors."""
    print(f"hpctrain report: error: {message}", file=sys.stderr)
    sys.exit(2)


def load(run_dir):
    path = os.path.join(run_dir, "metrics.h5")
    if not os.path.exists(path):
        input_error(f"{path} does not exist (is {run_dir} a run directory?)")
    with h5py.File(path, "r") as f:
        return {group: {name: f[group][name][()] for name in f[group]} for group in ("train", "eval") if group in f}


def summary(run_dir, metrics):
    train, evaluation = metrics.get("train", {}), metrics.get("eval", {})
    lines = [f"run: {os.path.abspath(run_dir)}"]
    steps = train.get("step", np.array([]))
    if len(steps) == 0:
        return "\n".join(lines + ["no training steps recorded"])
    rates = train["samples_per_sec"][len(steps) // 10:]  # leave out the warm-up
    lines.append(f"steps: {int(steps[-1])}; final training loss {train['loss'][-1]:.6g}; "
                 f"median {np.median(rates):.0f} samples/s; skipped steps {int(train['skipped'].sum())}")
    if len(evaluation.get("step", [])):
        values = ", ".join(f"{name} {evaluation[name][-1]:.6g}" for name in sorted(evaluation) if name != "step")
        lines.append(f"evaluation at step {int(evaluation['step'][-1])}: {values}")
    checkpoints = os.path.join(run_dir, "checkpoints")
    if os.path.isdir(checkpoints):
        files = sorted(name for name in os.listdir(checkpoints) if name.endswith(".h5"))
        lines.append(f"checkpoints: {', '.join(files) if files else 'none'}")
    return "\n".join(lines)


def plot(metrics, out):
    import matplotlib
    matplotlib.use("Agg")  # no display on compute nodes
    import matplotlib.pyplot as plt
    train, evaluation = metrics.get("train", {}), metrics.get("eval", {})
    figure, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    (loss_axis, eval_axis), (lr_axis, scale_axis) = axes
    loss_axis.plot(train["step"], train["loss"], lw=0.8, label="training loss")
    if len(evaluation.get("step", [])):
        loss_axis.plot(evaluation["step"], evaluation["loss"], "o-", label="evaluation loss")
        for name in sorted(evaluation):
            if name not in ("step", "loss"):
                eval_axis.plot(evaluation["step"], evaluation[name], "o-", label=name)
        eval_axis.legend()
    eval_axis.set_title("evaluation metrics")
    loss_axis.set_yscale("log" if np.all(train["loss"] > 0) else "linear")
    loss_axis.set_title("loss")
    loss_axis.legend()
    lr_axis.plot(train["step"], train["lr"])
    lr_axis.set_title("learning rate")
    scale_axis.plot(train["step"], train["loss_scale"])
    skipped = train["skipped"] > 0
    if skipped.any():
        scale_axis.plot(train["step"][skipped], train["loss_scale"][skipped], "rx", label="skipped step")
        scale_axis.legend()
    scale_axis.set_yscale("log")
    scale_axis.set_title("loss scale")
    for axis in axes.flat:
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    figure.savefig(out, dpi=100)


def main():
    parser = argparse.ArgumentParser(description="Summarise an hpctrain run and plot its curves.")
    parser.add_argument("run_dir")
    parser.add_argument("--plot", metavar="OUT.png", help="write the curves to this PNG")
    arguments = parser.parse_args()
    metrics = load(arguments.run_dir)
    print(summary(arguments.run_dir, metrics))
    if arguments.plot:
        plot(metrics, arguments.plot)
        print(f"plot: {arguments.plot}")


if __name__ == "__main__":
    main()
