#!/usr/bin/env python3
"""PyTorch twin of hpctrain's benchmark models: the anchor that bench/run.sh (the MLP) and bench/cnn.sh (--model cnn2d,
--model cosmoflow-small[-gn]: the CNNs of inputs/cnn2d.toml and inputs/cosmoflow-small.toml, -gn with GroupNorm(4)
after each convolution) measure hpctrain's samples/s against. --model gpt is a GPT-2 style language model (--gpt
LAYERS,HEADS,WIDTH,CONTEXT,VOCABULARY; nanoGPT's blocks: pre-LayerNorm, c_attn + scaled_dot_product_attention(causal)
+ c_proj, c_fc + GELU(tanh) + c_proj, a final LayerNorm and a bias-free head, --tie to share it with the token
table) on random tokens or a token file (--data with /tokens: windows of CONTEXT + 1 tokens at i * CONTEXT); its rate
is also printed in tokens/s.

The same model (Linear 1024->2048, ReLU, Linear 2048->2048, ReLU, Linear 2048->10, cross-entropy), the same global
batch, AdamW with the same hyper-parameters (biases without weight decay, as hpctrain's default optimizer.no_decay),
and the same thread count. fp32 runs plain; bf16 runs the forward under torch.autocast("cpu", dtype=torch.bfloat16)
with fp32 master weights and optimizer, which is the recipe hpctrain's bf16 mode reproduces. torch.compile is used
when the installed torch has it and it works (--compile auto); the output says which. --compile best runs eager and
compiled steps in alternating timed windows and reports the faster (the other's figure is printed too).

Data: with --data FILE.h5 (the file bench/run.sh generates for hpctrain) the /features and /labels datasets are read
into memory once; without it, fixed random tensors (seeded) of the same shape stand in. The values do not change a
dense MLP's speed as long as the gradients stay normal floats (on data that the model fits perfectly they become
subnormal and every CPU framework slows down ~10x; see docs/performance.md). Every epoch is shuffled and each step
gathers its batch by index, as a DataLoader over an in-memory tensor would.

Timing: --warmup steps first (allocator, oneDNN primitive creation, compilation), then --windows windows of
--window-steps steps each; each window's samples/s is batch * steps / wall time, and the median over the windows is
reported. The last line is machine-readable for bench/run.sh:
    TWIN precision=fp32 threads=2 compile=no samples_per_sec=1234.5 windows=...
"""

import argparse
import os
import statistics
import sys
import time


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--model", choices=["mlp", "cnn2d", "cosmoflow-small", "cosmoflow-small-gn", "gpt"],
                        default="mlp",
                        help="mlp: --widths; cnn2d, cosmoflow-small: the layers of inputs/<model>.toml (needs --data); "
                        "gpt: --gpt")
    parser.add_argument("--gpt", default="12,12,768,64,50304",
                        help="gpt: layers, heads, width, context, vocabulary (default: GPT-2 124M at context 64)")
    parser.add_argument("--tie", action="store_true", help="gpt: the head shares the token table (GPT-2)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 keeps torch's default")
    parser.add_argument("--batch", type=int, default=256, help="global batch (one process: all of it)")
    parser.add_argument("--widths", default="1024,2048,2048,10", help="input width, then each linear layer's out")
    parser.add_argument("--samples", type=int, default=8192, help="random samples when --data is not given")
    parser.add_argument("--data", default="", help="HDF5 file with /features (N, F) and /labels (N)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before the windows")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window-steps", type=int, default=20)
    parser.add_argument("--compile", choices=["auto", "on", "off", "best"], default="auto",
                        help="best: time eager and compiled steps in alternating windows, report the faster")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: model and data on the GPU, torch.compile mode reduce-overhead, the loss read once per window",
    )
    return parser.parse_args()


def load_tokens(arguments, torch, context, vocabulary):
    """(inputs, targets) of shape (N, context): windows of context + 1 tokens starting at i * context."""
    if arguments.data:
        import h5py

        with h5py.File(arguments.data, "r") as file:
            stream = torch.from_numpy(file["tokens"][...].astype("int64"))
        source = f"{arguments.data} ({stream.numel()} tokens)"
    else:
        generator = torch.Generator().manual_seed(arguments.seed)
        stream = torch.randint(0, vocabulary, (arguments.samples * context + 1,), generator=generator)
        source = f"random tokens ({stream.numel()}, seed {arguments.seed})"
    windows = (stream.numel() - 1) // context
    if windows < arguments.batch:
        sys.exit(f"torch_twin: {windows} windows of {context} tokens cannot fill a batch of {arguments.batch}")
    inputs = stream[: windows * context].view(windows, context)
    targets = stream[1 : windows * context + 1].view(windows, context)
    return inputs.contiguous(), targets.contiguous(), source


def gpt_model(torch, layers, heads, width, context, vocabulary, tie):
    """nanoGPT's GPT-2 (no dropout) with its initialisation, and the module names of GPT-2's checkpoints."""
    nn = torch.nn
    functional = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)

        def forward(self, x):
            batch, positions, _ = x.shape
            q, k, v = self.c_attn(x).split(width, dim=2)
            q, k, v = (t.view(batch, positions, heads, width // heads).transpose(1, 2) for t in (q, k, v))
            y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(batch, positions, width))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(width), Attention(), nn.LayerNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"),
                                     nn.Linear(4 * width, width))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocabulary, width), nn.Embedding(context, width)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)
            self.lm_head = nn.Linear(width, vocabulary, bias=False)
            if tie:
                self.lm_head.weight = self.wte.weight

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    model = GPT()
    # GPT-2's initialisation (hpctrain's model.init = "gpt2"): weights normal(0, 0.02), biases zero, the residual
    # output projections (attn.c_proj, mlp's second linear) normal(0, 0.02 / sqrt(2 * layers)).
    for name, parameter in model.named_parameters():
        if parameter.dim() > 1:
            residual_output = name.endswith("attn.c_proj.weight") or name.endswith("mlp.2.weight")
            torch.nn.init.normal_(parameter, 0.0, 0.02 / (2 * layers) ** 0.5 if residual_output else 0.02)
        elif name.endswith("bias") and "ln_" not in name:
            torch.nn.init.zeros_(parameter)
    return model


def load_data(arguments, torch, input_width, classes):
    if arguments.data:
        import h5py  # Debian's python3-h5py (bench/.venv sees Debian's packages)

        with h5py.File(arguments.data, "r") as file:
            features = torch.from_numpy(file["features"][...]).float().contiguous()
            if "labels" in file:
                labels = torch.from_numpy(file["labels"][...]).long()
            else:  # regression targets (N, K)
                labels = torch.from_numpy(file["targets"][...]).float().contiguous()
        source = f"{arguments.data} ({features.shape[0]} samples of shape {tuple(features.shape[1:])})"
        if arguments.model != "mlp":
            return features, labels, source
    else:
        generator = torch.Generator().manual_seed(arguments.seed)
        features = torch.randn(arguments.samples, input_width, generator=generator)
        labels = torch.randint(0, classes, (arguments.samples,), generator=generator)
        source = f"fixed random tensors ({arguments.samples} samples, seed {arguments.seed})"
    if features.shape[1] != input_width:
        sys.exit(f"torch_twin: the data has {features.shape[1]} features, the model expects {input_width}")
    if features.shape[0] < arguments.batch:
        sys.exit(f"torch_twin: {features.shape[0]} samples cannot fill a batch of {arguments.batch}")
    return features, labels, source


def main():
    arguments = parse_arguments()
    if arguments.threads > 0:
        # A torch built on the system BLAS (Debian's) runs fp32 products in OpenBLAS, whose own thread pool ignores
        # torch.set_num_threads; it reads this variable when it loads, so it must be set before the import.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(arguments.threads))
    try:
        import torch
    except ImportError:
        # bench/run.sh looks for this line and marks the torch rows "not measured".
        print("TWIN status=not-installed (no 'import torch' for this python; see bench/install-torch.sh)")
        return 0
    import torch.nn.functional as functional

    if arguments.threads > 0:
        torch.set_num_threads(arguments.threads)
    torch.manual_seed(arguments.seed)
    widths = [int(width) for width in arguments.widths.split(",")]
    nn = torch.nn
    if arguments.model == "mlp":
        layers = []
        for index in range(len(widths) - 1):
            layers.append(nn.Linear(widths[index], widths[index + 1]))
            if index < len(widths) - 2:
                layers.append(nn.ReLU())
        model = nn.Sequential(*layers)
        description = "-".join(map(str, widths))
    elif arguments.model == "gpt":
        layers, heads, width, context, vocabulary = (int(value) for value in arguments.gpt.split(","))
        model = gpt_model(torch, layers, heads, width, context, vocabulary, arguments.tie)
        description = (f"gpt {layers} layers x {heads} heads, width {width}, context {context}, vocabulary "
                       f"{vocabulary}{', tied head' if arguments.tie else ''}")
    else:
        if not arguments.data:
            sys.exit(f"torch_twin: --model {arguments.model} needs --data (the file bench/cnn.sh generates)")
    if arguments.model == "gpt":
        features, labels, source = load_tokens(arguments, torch, context, vocabulary)
    else:
        features, labels, source = load_data(arguments, torch, widths[0], widths[-1])
    if arguments.model == "cnn2d":  # inputs/cnn2d.toml
        channels, classes = features.shape[1], int(labels.max()) + 1
        model = nn.Sequential(
            nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * (features.shape[2] // 4) * (features.shape[3] // 4), classes))
        description = "cnn2d (inputs/cnn2d.toml)"
    elif arguments.model.startswith("cosmoflow-small"):  # inputs/cosmoflow-small.toml (-gn: groupnorm after each conv)
        channels, size = features.shape[1], features.shape[2]
        norm = arguments.model.endswith("-gn")

        class Float32GroupNorm(nn.GroupNorm):
            # Norms in fp32, as hpctrain's policy and CUDA autocast have it (torch 1.13's CPU autocast has no rule
            # for group_norm and fails on bf16 input with fp32 parameters).
            def forward(self, x):
                return super().forward(x.float())

        def block(inputs, outputs):
            return [nn.Conv3d(inputs, outputs, 3, padding=1)] + ([Float32GroupNorm(4, outputs)] if norm else []) + [
                nn.LeakyReLU(0.3), nn.MaxPool3d(2)]

        model = nn.Sequential(
            *block(channels, 8), *block(8, 16), *block(16, 16),
            nn.Flatten(), nn.Linear(16 * (size // 8) ** 3, 64), nn.LeakyReLU(0.3), nn.Linear(64, labels.shape[1]))
        description = f"{arguments.model} (inputs/cosmoflow-small.toml{' + groupnorm' if norm else ''})"
    # hpctrain's default optimizer.no_decay = ["bias", "norm"]: biases and norm layers' parameters get no weight decay,
    # so none here either.
    def decays(name, parameter):
        return not name.endswith("bias") and parameter.dim() > 1

    decayed = [parameter for name, parameter in model.named_parameters() if decays(name, parameter)]
    not_decayed = [parameter for name, parameter in model.named_parameters() if not decays(name, parameter)]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": arguments.weight_decay}, {"params": not_decayed, "weight_decay": 0.0}],
        lr=arguments.lr,
    )
    bf16 = arguments.precision == "bf16"
    device = arguments.device
    if device == "cuda":
        if not torch.cuda.is_available():
            print("TWIN status=no-gpu (torch.cuda.is_available() is false)")
            return 0
        model.to(device)
        features, labels = features.to(device), labels.to(device)
    loss_function = functional.mse_loss if arguments.model.startswith("cosmoflow-small") else functional.cross_entropy
    if arguments.model == "gpt":  # the mean over every position of the batch

        def loss_function(logits, targets):
            return functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    def make_step(forward):
        def train_step(x, y):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                logits = forward(x)
            # The loss in fp32, as autocast would run cross_entropy anyway, and as hpctrain's policy does.
            loss = loss_function(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss

        return train_step

    step_function = make_step(model)
    eager_step = step_function
    # torch.compile (PyTorch >= 2.0) compiles the forward; the backward comes with it through AOTAutograd.
    if arguments.compile == "off":
        compiled = "no (--compile off)"
    elif not hasattr(torch, "compile"):
        compiled = "no (this torch has no torch.compile)"
    else:
        try:
            mode = "reduce-overhead" if device == "cuda" else None  # CUDA graphs on the GPU
            compiled_step = make_step(torch.compile(model, mode=mode))
            compiled_step(features[: arguments.batch], labels[: arguments.batch]).item()  # compiles now, or raises
            step_function = compiled_step
            compiled = "yes"
        except Exception as error:  # any compiler failure: fall back to eager and say why
            if arguments.compile == "on":
                raise
            compiled = f"no (torch.compile failed: {type(error).__name__}: {str(error).splitlines()[0][:120]})"
    # --compile best: both variants, window by window in turn (the same parameters and optimizer), so that load from
    # elsewhere hits both; the faster median is the figure (issue 16: PyTorch's best of eager and torch.compile).
    variants = {"eager": eager_step}
    if arguments.compile == "best" and compiled == "yes":
        variants["compile"] = step_function
    elif compiled == "yes":
        variants = {"compile": step_function}

    print(
        f"torch_twin: torch {torch.__version__}, {arguments.precision}"
        + (" (autocast bf16)" if bf16 else "")
        + f", {torch.get_num_threads()} threads, batch {arguments.batch}, model {description}, AdamW"
    )
    print(f"torch_twin: data {source}; torch.compile: {compiled}")

    generator = torch.Generator().manual_seed(arguments.seed + 1)
    order = torch.randperm(features.shape[0], generator=generator).to(device)
    position = 0

    def next_batch():
        nonlocal order, position
        if position + arguments.batch > order.numel():  # epoch boundary: reshuffle (drop the incomplete batch)
            order = torch.randperm(features.shape[0], generator=generator).to(device)
            position = 0
        indices = order[position : position + arguments.batch]
        position += arguments.batch
        return features.index_select(0, indices), labels.index_select(0, indices)

    for step in variants.values():
        for _ in range(arguments.warmup):
            step(*next_batch()).item()
    rates = {name: [] for name in variants}
    for _ in range(arguments.windows):
        for name, step in variants.items():
            start = time.perf_counter()
            for _ in range(arguments.window_steps):
                loss = step(*next_batch())
                if device == "cpu":
                    loss.item()  # the host sees the loss every step, as hpctrain's log and metrics do on the CPU
            loss.item()  # on the GPU once per window (hpctrain reads its losses back every log_every steps)
            elapsed = time.perf_counter() - start
            rates[name].append(arguments.batch * arguments.window_steps / elapsed)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    best = max(medians, key=medians.get)
    median = medians[best]
    for name, values in rates.items():
        print(f"torch_twin: {name} samples/s per window: " + ", ".join(f"{rate:.4g}" for rate in values)
              + f" (median {medians[name]:.4g})")
    if len(variants) > 1:
        print(f"torch_twin: the faster is {best}")
    rates = rates[best]
    if arguments.model == "gpt":
        print(f"torch_twin: {median * context:.1f} tokens/s (median), {arguments.batch / median:.3f} s/step")
    print(
        f"TWIN device={device} precision={arguments.precision} threads={torch.get_num_threads()} "
        f"compile={'yes' if best == 'compile' else 'no'} torch={torch.__version__} samples_per_sec={median:.4f} "
        f"windows={len(rates)}x{arguments.window_steps} final_loss={loss.item():.5f}"
        + "".join(f" {name}_rate={value:.4f}" for name, value in medians.items())
    )
    return 0


def use_benchmark_environment():
    """Re-runs this script with bench/install-torch.sh's environment (bench/.venv, or HPCTRAIN_TORCH_VENV) when it
    exists and is not the running interpreter's, so that a plain `bench/torch_twin.py` measures that PyTorch."""
    default = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".venv")
    python = os.path.join(os.environ.get("HPCTRAIN_TORCH_VENV", default), "bin", "python")
    if os.path.exists(python) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.dirname(os.path.dirname(python))):
        os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == "__main__":
    use_benchmark_environment()
    sys.exit(main())
