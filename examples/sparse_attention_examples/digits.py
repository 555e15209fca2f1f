"""scikit-learn's handwritten digits as a Study-A dataset from outside the library, found through the entry-point group
`sparse_attention_repro.datasets` (`--datasets digits`), with no edit to the library.

The 1,797 8×8 greyscale images (UCI optdigits, as shipped inside scikit-learn: nothing is downloaded) are split in
scikit-learn's order, the first 1,437 for training and the last 360 for test; each pixel's ink count 0–16 is scaled to
0–255 so that the lab's image path (uint8, scaled to [0, 1]) reads it. Patches of 2×2 give 16 tokens plus CLS. Its
comparisons form their own Holm family (it is not one of the paper's datasets)."""
import numpy as np
from sparse_attention_repro.data import DatasetSpec

TRAIN = 1437

def digits_arrays() -> dict:
    "The `{train,test}_{x,y}` arrays: uint8 images [N, 8, 8] and int64 labels, in scikit-learn's order."
    from sklearn.datasets import load_digits
    d = load_digits()
    x, y = np.round(d.images * (255 / 16)).astype(np.uint8), d.target.astype(np.int64)
    return dict(train_x=x[:TRAIN], train_y=y[:TRAIN], test_x=x[TRAIN:], test_y=y[TRAIN:])

def _offline(root, cache):
    "One source: the copy inside scikit-learn (no files of ours to check)."
    return [("sklearn:load_digits", "scikit-learn's load_digits", [], digits_arrays)]

digits = DatasetSpec("digits", "image", n_classes=10, epochs=6, train_n=1000, test_n=300, patch=2, image=(8, 8, 1), offline=_offline,
                     hint="install scikit-learn (its load_digits ships the images)")
