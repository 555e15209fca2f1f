"""The length study's pieces with every registered normalizer and with a task from outside the library."""
import sys, textwrap
import numpy as np
import pytest
import torch
from sparse_attention_repro.decoder import CausalDecoder, CausalSelfAttention, DecoderConfig
from sparse_attention_repro.length_tasks import get_task, registered_tasks
from sparse_attention_repro.length_train import LengthRunConfig, evaluate_lengths, train_run
from sparse_attention_repro.normalizers import registered_normalizers

NORMALIZERS = [n for n in registered_normalizers() if not n.endswith("_bisect")] + ["topk_softmax_025"]


@pytest.mark.parametrize("name", NORMALIZERS)
def test_query_blocks_and_causality_with_every_normalizer(name):
    """Blocks of queries give what one block gives, forward and backward (each block recomputed), and no query sees a
    later token: with every registered normalizer (a normalizer that places its queries among its keys, as
    stick-breaking does, must take a block as the last queries)."""
    torch.manual_seed(0)
    att = CausalSelfAttention(DecoderConfig(10, width=16, heads=4, normalizer=name, query_block=64)).double()
    h = torch.randn(2, 21, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 21, 16, dtype=torch.float64)
    full = att(h)
    (full * g).sum().backward()
    kept = [h.grad.clone()] + [p.grad.clone() for p in att.parameters()]
    att.block, h.grad = 4, None
    att.zero_grad()
    blocked = att(h)
    torch.testing.assert_close(blocked, full, atol=1e-9, rtol=0)
    (blocked * g).sum().backward()                                  # the blocks recomputed in the backward
    for x, y in zip(kept, [h.grad] + [p.grad for p in att.parameters()]): torch.testing.assert_close(x, y, atol=1e-9, rtol=0)
    h = h.detach()
    full = full.detach()
    h2 = h.clone(); h2[:, 13:] = torch.randn(2, 8, 16, dtype=torch.float64)
    torch.testing.assert_close(att(h2)[:, :13], full[:, :13], atol=1e-9, rtol=0)


def test_asentmax_gets_the_models_width_nope_heads_and_context():
    att = CausalSelfAttention(DecoderConfig(10, width=24, heads=4, normalizer="asentmax"))
    assert att.normalizer.beta.in_features == 24 and att.normalizer.scaled == 2         # NAPE: the last 2 of 4 heads
    assert CausalSelfAttention(DecoderConfig(10, width=24, heads=4, normalizer="asentmax", positions="rope")).normalizer.scaled == 4
    seen = {}
    hook = att.normalizer.register_forward_hook(lambda m, args, kwargs, out: seen.update(kwargs), with_kwargs=True)
    h = torch.randn(1, 7, 24)
    att(h); hook.remove()
    assert torch.equal(seen["hidden"], h) and torch.equal(seen["positions"], torch.arange(7))


OUTSIDE_TASK = '''
import numpy as np
from sparse_attention_repro.length_tasks import LengthTask, FIRST_SYMBOL

def make_majority(rng, n, length):
    "Bits; the target is the more frequent one (ties: 1)."
    x = rng.integers(0, 2, (n, length))
    return FIRST_SYMBOL + x, FIRST_SYMBOL + (2 * x.sum(1, keepdims=True) >= length)

majority = LengthTask("majority", 2, 1, make_majority, "majority of bits")
'''


def test_a_task_from_outside_the_library_trains_and_tests(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(textwrap.dedent(OUTSIDE_TASK))
    monkeypatch.syspath_prepend(str(tmp_path))
    task = get_task("my_tasks:majority")
    assert task.name == "majority" and "majority" in registered_tasks()
    cfg = LengthRunConfig("my_tasks:majority", steps=20, eval_every=10, warmup=5, batch_size=8, width=16, layers=1, heads=2, ffn=32)
    record = train_run(cfg, tmp_path / "run")
    assert record["status"] == "ok" and [r["step"] for r in record["curve"]] == [10, 20]
    rows = evaluate_lengths(cfg, tmp_path / "run", 20, [64, 256], 16)
    assert [r["length"] for r in rows] == [64, 256] and all(0 <= r["accuracy"] <= 1 for r in rows)


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    "The `sparse-repro` script once, then the same entry point (`cli.main`) in process: status 2, one line, nothing written."
    from conftest import cli
    from sparse_attention_repro.cli import main
    out = tmp_path / "out"
    res = cli("length", "--out", out, "--tasks", "nope")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "unknown task 'nope'" in res.stderr, res.stderr
    for args, says in [(["--tasks", "mqmtar", "--test-lengths", "16"], "test length 16 is below task mqmtar's shortest input"),
                       (["--normalizers", "nope"], "unknown normalizer 'nope'"),
                       (["--positions", "alibi"], "unknown position scheme 'alibi'"),
                       (["--steps", "-3"], "--steps must be positive"),
                       (["--profile", "huge"], "unknown profile 'huge'")]:
        assert main(["length", "--out", str(out), *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, (args, err)
        assert not out.exists()


@pytest.mark.slow                  # the command line end to end (papermill, resume, tables); training and testing one run are tested above
def test_length_grid_dry_run_then_run_then_resume(tmp_path):
    from conftest import cli
    import pandas as pd
    out = tmp_path / "out"
    dry = cli("length", "--out", out, "--dry-run")
    assert dry.returncode == 0 and "2 runs, 2 still to run" in dry.stdout and not out.exists()
    res = cli("length", "--out", out, "--jobs", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    rows = pd.read_csv(out / "length_runs.csv")
    assert len(rows) == 2 * (2 + 2) and set(rows.split) == {"validation", "test"} and (rows.status == "ok").all()
    assert set(rows[rows.split == "test"].length) == {64, 128}
    again = cli("length", "--out", out, "--dry-run")
    assert "2 runs, 0 still to run" in again.stdout
    tables = cli("length", "--out", out, "--tables")
    assert tables.returncode == 0, tables.stderr[-2000:]
    recipes = pd.read_csv(out / "tables" / "length_recipes.csv")            # one seed: each arm's best validated step
    assert set(recipes.normalizer) == {"softmax", "sparsemax"} and set(recipes.step) <= {10, 20}
    acc = pd.read_csv(out / "tables" / "length_accuracy.csv")                # tested at the last step only: read there
    assert list(acc.columns[:4]) == ["task", "normalizer", "positions", "length"]
    assert set(acc.normalizer) == set(recipes[recipes.step == 20].normalizer)
