"""Attention normalizers from recent papers, registered with `sparse_attention_repro` from outside the library.

Installed (`pip install -e examples`), each is found by its name through the entry-point group
`sparse_attention_repro.normalizers`; without installing, `--methods sparse_attention_examples.softpick:softpick` works
from this folder. Each file is one normalizer and the formula of its paper.
"""
