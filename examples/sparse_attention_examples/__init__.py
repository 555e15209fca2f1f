"""Attention normalizers from recent papers, registered with `sparse_attention_repro` from outside the library.

Installed (`pip install -e examples`), each is found by its name through the entry-point group
`sparse_attention_repro.normalizers`; without installing, `--methods sparse_attention_examples.softpick:softpick` works
from this folder. Each file is one normalizer and the formula of its paper:

- `sigmoid_attention`: sigmoid(s - log n) (Ramapuram et al., 2024)
- `scalable_softmax`: softmax(s log(n) z), s learned per head (Nakanishi, 2025)
- `softpick`: ReLU(e^x - 1) / sum |e^x - 1| (Zuhri, Fuadi & Aji, 2025)
- `softmax_sink`: e^x / (1 + sum e^x), the off-by-one softmax (Miller, 2023)
- `stick_breaking`: sigmoid shares of a unit stick, nearest key first (Tan et al., 2024)
- `relu_attention`: ReLU(s) / n, ReLA without its output norm (Zhang, Titov & Sennrich, 2021; Wortsman et al., 2023)
- `normmax`: argmax <p, z> - ||p||_2 over the simplex (Santos et al., 2024)
- `learned_temperature_softmax`: softmax(t z), t learned per head, Scalable-Softmax's fixed-length control
- `asentmax`: 1.5-entmax of queries scaled by 1 + softplus(beta(h)) log(i+2)^(2 tanh(gamma(h))) (Vasylenko et al., 2026)
"""
