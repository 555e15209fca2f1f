"""Training time of one study A run per normalizer, as a ratio to softmax, side by side in one process.

    python benchmarks/training.py [--datasets fashion_mnist twenty_news] [--epochs 1] [--repeats 2] [--threads 1]

Each method trains on the paper-size train subset of seed 0 for `--epochs` epochs (same data, same initial weights);
runs are interleaved over `--repeats` rounds and the median train time is reported as a ratio to softmax's.
Needs the data (SPARSE_REPRO_DATA) like the grid.
"""
import argparse, statistics
import torch
from sparse_attention_repro.data import load_dataset
from sparse_attention_repro.normalizers import NORMALIZERS
from sparse_attention_repro.train import profile_config, run_one

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["fashion_mnist", "twenty_news"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 = as in a grid job on 2 cores)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.epochs} epoch(s), median of {args.repeats}")
    for ds in args.datasets:
        cfg = profile_config("paper", ds, epochs=args.epochs, progress=False)
        data = load_dataset(ds, 0, cfg.train_limit, cfg.test_limit)
        times = {m: [] for m in NORMALIZERS}
        for _ in range(args.repeats):
            for m in NORMALIZERS: times[m].append(run_one(ds, m, 0, cfg, data)["train_seconds"])
        med = {m: statistics.median(v) for m, v in times.items()}
        print(f"\n{ds}: {cfg.train_limit} examples, T = {data.seq_len + 1}; softmax {med['softmax']:.1f} s per epoch")
        for m in NORMALIZERS: print(f"  {m:28s} {med[m] / med['softmax']:6.2f}x softmax")
