"""Forward+backward time of every attention normalizer as a ratio to softmax, side by side in one process.

    python benchmarks/normalizers.py [--repeats 30] [--threads 1]

For each shape the table gives the median time of `norm(scores).backward(g)` over `--repeats` runs (after warm-up),
for this project's implementation and for the `entmax` package's where it has one, both as a ratio to softmax.
Timings are medians of interleaved runs; the machine is shared, so read the ratios, not the milliseconds.
"""
import argparse, statistics, time
import torch
import entmax
from sparse_attention_repro.normalizers import get_normalizer, NORMALIZERS

def entmax_package(name, num_heads):
    "The entmax package's version of a normalizer, or None."
    if name == "sparsemax": return lambda s: entmax.sparsemax(s, dim=-1)
    if name == "entmax15": return lambda s: entmax.entmax15(s, dim=-1)
    if name == "headwise_adaptive_entmax":
        logit = torch.zeros(num_heads, requires_grad=True)
        return lambda s: entmax.entmax_bisect(s, (1.05 + 0.9 * torch.sigmoid(logit)).view(-1, 1, 1), dim=-1)
    return None

def fwd_bwd(fn, scores, g):
    "Seconds of one forward + backward."
    s = scores.detach().requires_grad_()
    t0 = time.perf_counter()
    fn(s).backward(g)
    return time.perf_counter() - t0

def bench(shape, repeats):
    torch.manual_seed(0)
    scores, g = torch.randn(shape), torch.randn(shape)
    fns = {}
    for name in NORMALIZERS:
        fns[(name, "ours")] = get_normalizer(name, num_heads=shape[1])
        pkg = entmax_package(name, shape[1])
        if pkg is not None: fns[(name, "entmax pkg")] = pkg
    times = {k: [] for k in fns}
    for _ in range(3):                                   # warm-up
        for k, fn in fns.items(): fwd_bwd(fn, scores, g)
    for _ in range(repeats):                             # interleaved, so load changes hit every variant alike
        for k, fn in fns.items(): times[k].append(fwd_bwd(fn, scores, g))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med[("softmax", "ours")]
    print(f"\nshape {tuple(shape)}: softmax forward+backward median {base * 1e3:.2f} ms")
    print(f"{'normalizer':28s} {'ours / softmax':>15s} {'entmax pkg / softmax':>21s} {'pkg / ours':>11s}")
    for name in NORMALIZERS:
        ours, pkg = med[(name, "ours")], med.get((name, "entmax pkg"))
        pk = f"{pkg / base:21.2f}" if pkg else f"{'-':>21s}"
        sp = f"{pkg / ours:11.2f}" if pkg else f"{'-':>11s}"
        print(f"{name:28s} {ours / base:15.2f} {pk} {sp}")

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 = as in a grid job)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.repeats} repeats")
    for shape in [(96, 4, 17, 17), (96, 4, 97, 97)]: bench(shape, args.repeats)
