"""The package's face: the public API imports from the top level, and the core needs only torch and numpy."""
import subprocess, sys
import sparse_attention_repro

def test_every_public_name_resolves():
    import importlib
    for name in sparse_attention_repro.__all__:                       # the top-level name is the module's own object
        module = importlib.import_module(f"sparse_attention_repro.{sparse_attention_repro._WHERE[name]}")
        assert getattr(sparse_attention_repro, name) is getattr(module, name), name
    from sparse_attention_repro import get_normalizer, PAPER_METHODS, CompactClassifier, ClassifierConfig
    import torch
    model = CompactClassifier(ClassifierConfig(num_classes=10, seq_len=16, input_dim=49, normalizer=PAPER_METHODS[1]))
    assert model(torch.rand(2, 16, 49)).shape == (2, 10) and model.method == "sparsemax"
    assert get_normalizer("entmax15").name == "entmax15"

def test_core_imports_need_only_torch_and_numpy():
    code = ("import sys; import sparse_attention_repro.normalizers, sparse_attention_repro.model; "
            "heavy = sorted(m for m in ('pandas', 'transformers', 'papermill', 'pingouin', 'sklearn', 'dask', 'matplotlib') "
            "if m in sys.modules); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
