# %% [markdown]
# # Row kernels for the sparse normalizers
# > The hot loops of sparsemax, entmax-1.5, learned-α entmax and top-k softmax as small C functions, built on first use.

# %%
#| default_exp kernels

# %% [markdown]
# Every sparse normalizer here finds a per-row threshold $\tau$ by iterating over the row (Michelot for sparsemax,
# Newton for entmax). Written with torch operations, each iteration is several passes over the whole `[B, H, T, T]`
# tensor, with a temporary per pass: at $T = 97$ that is tens of megabytes streamed per iteration, and entmax-1.5 costs
# 10–40× a softmax. A row of at most a few hundred scores fits in the L1 cache, so the fast way is to run *all* the
# iterations of one row there, then move to the next row. That is what these kernels do: one plain C function per
# normalizer and direction, vectorised by the compiler (`#pragma omp simd`), compiled once with the system C compiler
# into a shared library that `ctypes` calls on the tensors' memory.
#
# * **Short rows** (≤ 32 keys — the 17 of the image datasets) are transposed and processed 16 at a time, one row per
#   vector lane: a row of 17 would otherwise be one vector plus one leftover element, with a horizontal sum at every
#   step. Learned-α entmax does the same for short rows (its exp/log loops sit in their own functions: inlined into
#   the Newton loop, gcc would not vectorise them); on long rows its iterations skip the keys that can no longer be in
#   the support. Lanes and rows sum in a different order, so the two agree to a few float32 ulps, not bit for bit.
# * **Top-k** needs the k-th largest score of each row: by counting on short rows, by bisection on the scores' bits
#   mapped to order-preserving integers on long ones. No sort.
# * They handle **float32**, the training dtype (half precision is upcast to it by the normalizers). float64 and
#   non-CPU tensors take the torch path, which is what the float64 tests against the `entmax` package check.
# * `exp`/`log` are small branch-free polynomials (Cephes): libm's vector versions take a slow scalar path for the
#   zeros and $-\infty$ that masked or sparse rows are full of, and the compiler computes both sides of a select.
# * The math is the same as the torch path, step for step (same starting points, same stopping rules); the tests below
#   compare every kernel with it.
# * **Fused attention** (opt-in): one function runs a head's whole attention core — scores, normalizer, weighted values —
#   and another its backward, the $T \times T$ block kept in a scratch buffer (below).
# * **Dropout masks** come from a counter-based generator (Philox4x64-10, bit for bit numpy's `Philox`): any element of
#   the stream is computed on its own, 2.5–4× faster than torch's `bernoulli_` on this CPU (opt-in, see `model`).
# * No compiler, a failed build or `SPARSE_REPRO_KERNELS=0` → the torch path, with one warning saying why.
#   `use_kernels(False)` switches them off for a block of code (benchmarks and tests compare both paths).

# %%
#| export
import ctypes, fcntl, functools, hashlib, os, platform, re, shutil, subprocess, tempfile, warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
import torch
import sparse_attention_repro

# %%
from fastcore.test import test_eq, test_close, test_fail


# %% [markdown]
# ## The C source
#
# The kernels live in `nbs/csrc/`, one file per concern behind one header:
#
# | file | holds |
# |---|---|
# | `kernels.h` | the normalizer kinds (`enum normalizer_kind`, one code everywhere), the limits, the entry points |
# | `fastmath.h` | the branch-free `exp`/`log` (Cephes polynomials) and a row maximum |
# | `lanes.h` | moving 16 short rows into vector lanes and back, and the backward softmax, sparsemax and entmax-1.5 share |
# | `sparsemax.c`, `entmax.c`, `topk.c`, `softmax.c` | each normalizer's forward and backward side by side, rows and lanes |
# | `attention.c` | the fused attention core, forward and backward |
# | `random.c` | the two dropout generators (Philox, torch's Mersenne Twister) |
# | `kernels.c` | the build's one translation unit: it includes the others in that order |
#
# Each exported function takes contiguous float32 rows and writes its result rows; the comments explain the numerics.
# One translation unit keeps the helpers `static` and inlined, as they were when the source was a single file; a
# regular install ships the folder inside the package as `csrc/`.

# %%
#| export
def kernel_folder() -> Path:
    "The folder of the C sources: the checkout's `nbs/csrc`, else the copy installed with the package."
    pkg = Path(sparse_attention_repro.__file__).resolve().parent
    for d in (pkg.parent / "nbs" / "csrc", pkg / "csrc"):
        if (d / "kernels.c").is_file(): return d
    raise RuntimeError(f"kernel source not found ({pkg.parent / 'nbs' / 'csrc'} or {pkg / 'csrc'}); reinstall the package")

def kernel_files() -> dict:
    "Every C source and header of `kernel_folder()`, name: text, in name order."
    return {f.name: f.read_text() for f in sorted(kernel_folder().iterdir()) if f.suffix in (".c", ".h")}

def kernel_source() -> str:
    "All the C source as one text (what the build hashes and the checks below search)."
    return "".join(f"/* ==== {name} ==== */\n{text}" for name, text in kernel_files().items())

def _header_ints(pattern) -> dict:
    "Integer constants of `kernels.h` matching `pattern` (a regex with a name group and a value group)."
    return {m.group(1): int(m.group(2)) for m in re.finditer(pattern, kernel_files()["kernels.h"])}


# ## Building and loading
#
# The library is compiled with `-O3 -march=native` into the cache folder (`$SPARSE_REPRO_CACHE`, else
# `~/.cache/sparse_attention_repro`) under a name that hashes the source, the flags and the machine's CPU flags, so an
# edited kernel or another CPU gets its own build. Processes started together (the grid's notebooks) take turns on a
# lock file, so one compiles and the others load its result; the build writes a temporary file and renames it, so no
# process ever loads a half-written library. A cache folder that cannot be written is reported in one warning naming
# `SPARSE_REPRO_CACHE`, and the torch path is used.

# %%
#| export
CFLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"]
_CTYPE_OF = {"long": "L", "float": "F", "double": "D", "void": ""}   # a scalar's letter; any pointer is P

def header_signatures(header: str) -> tuple:
    """The ctypes signatures declared in `header` (the text of `kernels.h`): ({name: argument letters}, {name: return
    letter} for the functions that return a value), with P = pointer, L = long, F = float, D = double."""
    args, returns = {}, {}
    for ret, name, params in re.findall(r"^(\w+)\s+(\w+)\(([^)]*)\);", header, re.M):
        letters = []
        for param in " ".join(params.split()).split(","):
            kind = param.rsplit(" ", 1)[0].replace("const ", "").strip()
            if "*" in param: letters.append("P")
            elif kind in _CTYPE_OF and _CTYPE_OF[kind]: letters.append(_CTYPE_OF[kind])
            else: raise ValueError(f"kernels.h: {name} takes a {param.strip()!r}, which has no ctypes letter; add it to _CTYPE_OF")
        args[name] = "".join(letters)
        if ret != "void": returns[name] = _CTYPE_OF[ret]
    return args, returns

_CTYPES = {"P": ctypes.c_void_p, "L": ctypes.c_long, "F": ctypes.c_float, "D": ctypes.c_double}
_state = {"lib": None, "tried": False, "enabled": True, "calls": 0}

def _cpu_tag():
    try: flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags"))
    except (OSError, StopIteration): flags = platform.processor()
    return hashlib.sha256((platform.machine() + flags).encode()).hexdigest()[:8]

def kernel_dir(cache_dir=None) -> Path:
    "Where built kernels live: `cache_dir`, else `$SPARSE_REPRO_CACHE`, else `~/.cache/sparse_attention_repro`; then `kernels/`."
    d = cache_dir or os.environ.get("SPARSE_REPRO_CACHE") or Path.home() / ".cache" / "sparse_attention_repro"
    return Path(d).expanduser() / "kernels"

def build_kernels(cache_dir=None) -> Path:
    "Compile `kernel_source()` (if not already built for this source, these flags and this CPU); returns the library's path."
    source = kernel_source()
    tag = hashlib.sha256((source + " ".join(CFLAGS)).encode()).hexdigest()[:12]
    out = kernel_dir(cache_dir) / f"normalizers-{tag}-{_cpu_tag()}.so"
    if out.exists(): return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(cc): raise RuntimeError(f"no C compiler found ({cc or 'cc, gcc'}; install gcc or set CC)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = open(out.with_suffix(".lock"), "w")
    except OSError as e:
        raise RuntimeError(f"the kernel cache {out.parent} is not writable ({e.strerror}); set SPARSE_REPRO_CACHE to a writable folder") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                         # one builder at a time; the others wait, then load
        if out.exists(): return out
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            for name, text in kernel_files().items(): (Path(tmp) / name).write_text(text)
            lib = Path(tmp) / "normalizers.so"
            r = subprocess.run([cc, *CFLAGS, str(Path(tmp) / "kernels.c"), "-o", str(lib), "-lm"], capture_output=True, text=True)
            if r.returncode: raise RuntimeError(f"{cc} failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            os.replace(lib, out)
    return out

def kernels():
    "The loaded kernel library, or None (disabled, or the build failed — warned once)."
    if not _state["enabled"] or os.environ.get("SPARSE_REPRO_KERNELS", "1") == "0": return None
    if not _state["tried"]:
        _state["tried"] = True
        try:
            lib = ctypes.CDLL(str(build_kernels()))
            signatures, returns = header_signatures(kernel_files()["kernels.h"])     # declared once, in the header
            for name, sig in signatures.items(): getattr(lib, name).argtypes = [_CTYPES[c] for c in sig]
            for name, r in returns.items(): getattr(lib, name).restype = _CTYPES[r]
            _state["lib"] = lib
        except Exception as e:
            warnings.warn(f"sparse_attention_repro: C kernels unavailable ({e}); using the slower torch path")
    return _state["lib"]

@contextmanager
def use_kernels(on: bool = True):
    "Switch the C kernels on or off inside a `with` block."
    old = _state["enabled"]; _state["enabled"] = on
    try: yield
    finally: _state["enabled"] = old

def usable(x) -> bool:
    "Can the kernels handle tensor `x`? (float32 on the CPU, kernels available and enabled)"
    return x.dtype == torch.float32 and x.device.type == "cpu" and kernels() is not None


# %% [markdown]
# The ctypes signatures are read from `kernels.h`, so a parameter added in C cannot be missed in Python. Checked against
# the table that was written by hand before (each letter one parameter), and on the header's continuation lines:

# %%
_sigs, _rets = header_signatures(kernel_files()["kernels.h"])
test_eq(_sigs, {"mask_rows": "PPPLLLL", "sparsemax_fwd": "PPPLL", "sparsemax_bwd": "PPPPLL", "entmax15_fwd": "PPPPLLLF", "entmax_alpha_fwd": "PPPPPLLLF",
                "entmax_bwd": "PPPPPPLL", "topk_softmax_fwd": "PPPPLLD", "softmax_bwd": "PPPPLL", "philox_bits": "PLLLL",
                "philox_dropout": "PLLLLLF", "mt_bernoulli": "PLPDF", "attention_fwd": "PPPPPPLLLLLFLDLF",
                "attention_bwd": "PPPPPPPLLLLLFL", "attention_scratch": "LL", "gelu_dropout_fwd": "PPPL",
                "gelu_dropout_bwd": "PPPPL", "residual_layernorm_fwd": "PPPPPPPPLLF", "residual_layernorm_bwd": "PPPPPPPPPLL"})
test_eq(_rets, {"attention_scratch": "L"})
test_eq(header_signatures("void f(const float* X,\n       long n, double r);\nlong g(long T);"), ({"f": "PLD", "g": "L"}, {"g": "L"}))
test_fail(lambda: header_signatures("void f(short n);"), contains="has no ctypes letter")

# %% [markdown]
# Every function the Python side calls is declared in `kernels.h` and defined in one `.c` file, both with as many
# parameters as its ctypes signature says:

# %%
_files = kernel_files()
for name, sig in _sigs.items():
    want = ("long" if name in _rets else "void", len(sig))
    decl = re.search(rf"^(void|long) {name}\(([^)]*)\);", _files["kernels.h"], re.M)
    defs = [m for f, t in _files.items() if f.endswith(".c") for m in re.finditer(rf"^(void|long) {name}\(([^)]*)\) {{", t, re.M)]
    assert decl and len(defs) == 1, f"{name}: declared {bool(decl)}, defined {len(defs)} times"
    for m in (decl, defs[0]): test_eq((m.group(1), len(m.group(2).split(","))), want)

# %% [markdown]
# ## Calling a kernel
#
# `_run` calls one kernel on the rows of contiguous `[..., T]` tensors. With more than one torch thread and enough
# work, the rows are split into one chunk per thread: `ctypes` releases the GIL, so the chunks run in parallel.

# %%
#| export
_pool = {}

def _run(name, row_tensors, rows, n, *scalars, per_row=(), scratch=False):
    "Call kernel `name` on `row_tensors` (`[rows, n]`) and `per_row` tensors (`[rows]`, None allowed), chunked over threads."
    fn = getattr(kernels(), name)
    _state["calls"] += 1
    def call(lo, hi):
        ptrs = [t.data_ptr() + lo * n * 4 for t in row_tensors]
        ptrs += [None if t is None else t.data_ptr() + lo * 4 for t in per_row]
        buf = torch.empty(64 * (n + 16), dtype=torch.float32) if scratch else None   # scratch: a row, or 16-row blocks
        fn(*ptrs, *([buf.data_ptr()] if scratch else []), hi - lo, n, *scalars)
    _chunked(call, rows, rows * n)

def _chunked(call, items, work):
    "`call(lo, hi)` over [0, items): one chunk per torch thread when `work` (elements) is large enough, else one call."
    threads = torch.get_num_threads() if work >= 1 << 16 else 1
    if threads == 1: call(0, items); return
    bounds = [items * i // threads for i in range(threads + 1)]
    if threads not in _pool: _pool[threads] = ThreadPoolExecutor(threads)
    list(_pool[threads].map(lambda i: bounds[i + 1] > bounds[i] and call(bounds[i], bounds[i + 1]), range(threads)))


# %% [markdown]
# ## The kernels, one wrapper each
#
# Each takes contiguous float32 tensors whose last dimension is the key axis; `alpha_rows` holds one $\alpha$ per row
# (shape `[..., 1]`). The autograd functions in `normalizers` call these when `usable(scores)`.

# %%
#| export
_TOL = 4 * torch.finfo(torch.float32).eps       # Newton stops at a few ulps, as the torch path does

def _rows(x): return x.numel() // x.shape[-1], x.shape[-1]

def mask_rows(s, keep):
    """Scores `s` `[..., Tq, Tk]` (float32) with the keys that `keep` (bool, `[Tq, Tk]` or broadcast from it) leaves out at
    -inf: torch.where(keep, s, -inf) in one pass over `s`, the mask's rows read again for every head and batch."""
    s = s.contiguous(); keep = keep.reshape(s.shape[-2:]).contiguous(); out = torch.empty_like(s)
    lib, (rows, n), period = kernels(), _rows(s), s.shape[-2]
    _state["calls"] += 1
    def call(lo, hi): lib.mask_rows(s.data_ptr() + lo * n * 4, keep.data_ptr(), out.data_ptr() + lo * n * 4, hi - lo, n, period, lo)
    _chunked(call, rows, rows * n)
    return out

def sparsemax_fwd(x):
    "Sparsemax of every row of `x` (Michelot's algorithm, exact)."
    x = x.contiguous(); p = torch.empty_like(x); _run("sparsemax_fwd", [x, p], *_rows(x), scratch=True); return p

def sparsemax_bwd(p, g):
    "Gradient of sparsemax: `g` minus its mean over the support, 0 off the support."
    p, g = p.contiguous(), g.contiguous(); dx = torch.empty_like(p); _run("sparsemax_bwd", [p, g, dx], *_rows(p), scratch=True); return dx

ENTMAX15_ITERS = 50                              # entmax-1.5's Newton steps at most (it stops at a few ulps)

def entmax15_fwd(x, max_iter=ENTMAX15_ITERS, flags=False):
    """1.5-entmax of every row of `x` (Newton from the left); with `flags`, also the `[..., 1]` flags of the rows whose
    scores hold a NaN or +inf or no finite value (softmax's NaN rows), found while each block of rows is in the cache."""
    x = x.contiguous(); p = torch.empty_like(x)
    bad = torch.empty(x.shape[:-1] + (1,), dtype=torch.int32) if flags else None
    _run("entmax15_fwd", [x, p], *_rows(x), max_iter, _TOL, per_row=[bad], scratch=True)
    return (p, bad.bool()) if flags else p

def entmax_alpha_fwd(x, alpha_rows, max_iter=30, flags=False):
    """alpha-entmax of every row of `x`, with `alpha_rows[..., 0]` the alpha of each row; with `flags`, also the `[..., 1]`
    flags of the rows whose scores hold a NaN or +inf or no finite value (softmax's NaN rows)."""
    x = x.contiguous(); p = torch.empty_like(x)
    bad = torch.empty(x.shape[:-1] + (1,), dtype=torch.int32) if flags else None
    _run("entmax_alpha_fwd", [x, p], *_rows(x), max_iter, _TOL, per_row=[alpha_rows.contiguous(), bad], scratch=True)
    return (p, bad.bool()) if flags else p

def entmax_bwd(p, g, alpha_rows=None, d_alpha=False):
    "Gradient of alpha-entmax (alpha 1.5 when `alpha_rows` is None) and, if `d_alpha`, d loss / d alpha per row `[..., 1]`."
    p, g = p.contiguous(), g.contiguous(); dx = torch.empty_like(p)
    da = torch.empty(p.shape[:-1] + (1,), dtype=torch.float32) if d_alpha else None
    _run("entmax_bwd", [p, g, dx], *_rows(p), per_row=[None if alpha_rows is None else alpha_rows.contiguous(), da],
         scratch=True)
    return dx, da

def topk_softmax_fwd(x, ratio):
    """Softmax over the keys scoring at least the k-th largest of each row, k = max(1, ceil(ratio * valid keys)); and
    `[..., 1]` flags of the rows whose scores hold a NaN or +inf or no finite value (softmax's NaN rows), found on the way."""
    x = x.contiguous(); p = torch.empty_like(x); bad = torch.empty(x.shape[:-1] + (1,), dtype=torch.int32)
    _run("topk_softmax_fwd", [x, p], *_rows(x), float(ratio), per_row=[bad], scratch=True); return p, bad.bool()

def softmax_bwd(p, g):
    "Gradient of softmax: p * (g - <p, g>)."
    p, g = p.contiguous(), g.contiguous(); dx = torch.empty_like(p); _run("softmax_bwd", [p, g, dx], *_rows(p), scratch=True); return dx


# %% [markdown]
# ## Fused attention
#
# `attention_fwd` runs one attention layer's core — scores $QK^\top$ (queries scaled), the normalizer, the weighted
# sum of values — for one (batch, head) pair at a time, its $T \times T$ block kept in a scratch buffer that stays in
# the cache; `attention_bwd` runs the backward the same way. Short rows (T ≤ 32) go through the normalizer 16 heads
# at a time, so its 16-row lane blocks are full (one head's 17 rows would leave a second block with one row). Both read
# the fused QKV projection's output as it comes, `[B, T, 3, H, D]`, and write the output as the output projection
# wants it, `[B, T, H, D]`; only the weights `[B, H, T, T]` go through memory, once, for the backward. The torch path
# stays the reference: the sums run in another order, so the two agree to float32 rounding, not bit for bit (the
# model notebook tests it), which is why fused attention is an opt-in lever of the fast path. Head size at most 64.

# %%
#| export
ATTENTION_KINDS = {k.lower(): v for k, v in _header_ints(r"KIND_(\w+) = (\d+)").items()}   # enum normalizer_kind
ATTENTION_MAX_HEAD = _header_ints(r"#define (ATTENTION_MAX_HEAD) (\d+)")["ATTENTION_MAX_HEAD"]   # values per head it takes

def _attention_scratch(T, D):
    "Scratch of one chunk of heads, as long as the C source's `attention_scratch` says."
    return torch.empty(kernels().attention_scratch(T, D), dtype=torch.float32)

def attention_fwd(qkv, num_heads, kind, scale, ratio=1.0, alpha=None, max_iter=ENTMAX15_ITERS, key_mask=None):
    """Fused attention forward. `qkv`: `[B, T, 3 * H * D]` float32; `kind`: a key of `ATTENTION_KINDS`; `alpha`: `[H]`
    (entmax_alpha); `max_iter`: Newton steps (entmax kinds); `key_mask`: `[B, T]`, True on valid keys. Returns the
    output `[B, T, H * D]` and the weights `[B, H, T, T]`."""
    qkv = qkv.contiguous()
    B, T, C3 = qkv.shape; H = num_heads; D = C3 // (3 * H)
    if D > ATTENTION_MAX_HEAD: raise ValueError(f"fused attention takes heads of at most {ATTENTION_MAX_HEAD} values, got {D}")
    out, p = torch.empty(B, T, H * D, dtype=torch.float32), torch.empty(B, H, T, T, dtype=torch.float32)
    a = None if alpha is None else alpha.detach().float().contiguous()
    km = None if key_mask is None else key_mask.to(torch.uint8).contiguous()
    fn = kernels().attention_fwd
    def call(lo, hi):
        w = _attention_scratch(T, D)                                   # held until the call returns
        fn(qkv.data_ptr(), out.data_ptr(), p.data_ptr(), None if a is None else a.data_ptr(), None if km is None else km.data_ptr(), w.data_ptr(),
           lo, hi, T, H, D, scale, ATTENTION_KINDS[kind], float(ratio), max_iter, _TOL)
    _state["calls"] += 1
    _chunked(call, B * H, B * H * T * T)
    return out, p

def attention_bwd(qkv, p, grad_out, num_heads, kind, scale, alpha=None, d_alpha=False):
    """Fused attention backward: the gradient of `qkv` (`[B, T, 3 * H * D]`) and, with `d_alpha`, of `alpha` (`[H]`)."""
    qkv, p, grad_out = qkv.contiguous(), p.contiguous(), grad_out.float().contiguous()
    B, T, C3 = qkv.shape; H = num_heads; D = C3 // (3 * H)
    dqkv = torch.empty_like(qkv)
    a = None if alpha is None else alpha.detach().float().contiguous()
    da = torch.zeros(B * H, dtype=torch.float32) if d_alpha else None
    fn = kernels().attention_bwd
    def call(lo, hi):
        w = _attention_scratch(T, D)
        fn(qkv.data_ptr(), p.data_ptr(), grad_out.data_ptr(), dqkv.data_ptr(), None if a is None else a.data_ptr(),
           None if da is None else da.data_ptr(), w.data_ptr(), lo, hi, T, H, D, scale, ATTENTION_KINDS[kind])
    _state["calls"] += 1
    _chunked(call, B * H, B * H * T * T)
    return dqkv, None if da is None else da.view(B, H).sum(0)


# %% [markdown]
# ## The block's elementwise layers
#
# At the paper's sizes (T = 17, 64 channels, batches of 96) a training step of the encoder spends about half its time in
# the matrix products, which torch's BLAS runs near the arithmetic floor, and much of the rest in small elementwise
# operations, each a pass over memory and a dispatch: the residual sum, its dropout, LayerNorm, GELU and the dropout
# after it, forward and backward. `block.c` does each group in one pass, the llm.c way (one function per layer and
# direction): `residual_layernorm_*` computes $\mathrm{LN}(x + h \odot m)$ and its gradients for $x$, $h$, $\gamma$
# and $\beta$; `gelu_dropout_*` computes $\mathrm{GELU}(u) \odot m$ (the exact, erf-based GELU, through an erfc fit
# with relative error below $1.2 \cdot 10^{-7}$) and its gradient. A mask of None means no dropout (evaluation). They
# serve the model's `fused_block` path; the torch path stays the reference (tests below and in the model notebook).

# %%
#| export
def gelu_dropout_fwd(u, mask=None):
    "`GELU(u) * mask` (exact GELU; no dropout where `mask` is None), float32."
    u = u.float().contiguous(); y = torch.empty_like(u); m = None if mask is None else mask.float().contiguous()
    fn = kernels().gelu_dropout_fwd; _state["calls"] += 1
    _chunked(lambda lo, hi: fn(u.data_ptr() + 4 * lo, None if m is None else m.data_ptr() + 4 * lo, y.data_ptr() + 4 * lo, hi - lo),
             u.numel(), u.numel())
    return y

def gelu_dropout_bwd(u, mask, grad):
    "The gradient of `gelu_dropout_fwd` with respect to `u`, given the output's gradient `grad`."
    u, g = u.float().contiguous(), grad.float().contiguous(); du = torch.empty_like(u); m = None if mask is None else mask.float().contiguous()
    fn = kernels().gelu_dropout_bwd; _state["calls"] += 1
    _chunked(lambda lo, hi: fn(u.data_ptr() + 4 * lo, None if m is None else m.data_ptr() + 4 * lo, g.data_ptr() + 4 * lo,
                               du.data_ptr() + 4 * lo, hi - lo), u.numel(), u.numel())
    return du

def residual_layernorm_fwd(x, h, mask, weight, bias, eps):
    """`LayerNorm(x + h * mask)` over the last dimension (no dropout where `mask` is None), float32; also the normalised
    sum and the reciprocal standard deviation per row, which the backward takes."""
    x, h = x.float().contiguous(), h.float().contiguous(); m = None if mask is None else mask.float().contiguous()
    w, b = weight.detach().float().contiguous(), bias.detach().float().contiguous()
    rows, C = _rows(x)
    y, xhat, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(x.shape[:-1], dtype=torch.float32)
    fn = kernels().residual_layernorm_fwd; _state["calls"] += 1
    def call(lo, hi):
        o = 4 * lo * C
        fn(x.data_ptr() + o, h.data_ptr() + o, None if m is None else m.data_ptr() + o, w.data_ptr(), b.data_ptr(),
           y.data_ptr() + o, xhat.data_ptr() + o, rstd.data_ptr() + 4 * lo, hi - lo, C, float(eps))
    _chunked(call, rows, rows * C)
    return y, xhat, rstd

def residual_layernorm_bwd(xhat, rstd, mask, weight, grad):
    "Gradients of `residual_layernorm_fwd` for `x`, `h`, the weight and the bias, given the output's gradient `grad`."
    g = grad.float().contiguous(); m = None if mask is None else mask.float().contiguous()
    w = weight.detach().float().contiguous()
    rows, C = _rows(xhat)
    dx, dh, dw, db = torch.empty_like(xhat), torch.empty_like(xhat), torch.empty(C, dtype=torch.float32), torch.empty(C, dtype=torch.float32)
    _state["calls"] += 1
    kernels().residual_layernorm_bwd(xhat.data_ptr(), rstd.data_ptr(), None if m is None else m.data_ptr(), w.data_ptr(),
                                     g.data_ptr(), dx.data_ptr(), dh.data_ptr(), dw.data_ptr(), db.data_ptr(), rows, C)
    return dx, dh, dw, db


# %% [markdown]
# ## Philox dropout masks
#
# `philox_dropout` fills a float32 tensor with a dropout mask: element $i$ is `scale` where the $i$-th 32-bit draw of the
# Philox4x64-10 stream with key `key` is below `keep_below`, else 0. The stream is numpy's `Philox(key=key)` exactly, so
# numpy is both the reference of the tests and the fallback where the kernels are unavailable. Element $i$ depends only
# on $i$ and the key, so the tensor is split over threads freely.

# %%
#| export
def _key_words(key):
    "A Philox key as two signed 64-bit words (what ctypes passes as `long`)."
    return [int(k) - (1 << 64) if int(k) >= 1 << 63 else int(k) for k in key]

def philox_bits(n, key, first=0):
    "Draws `first` .. `first + n - 1` of the 32-bit Philox4x64-10 stream of `key` (two 64-bit words), as int64."
    out = torch.empty(n, dtype=torch.int32)
    kernels().philox_bits(out.data_ptr(), first, n, *_key_words(key))
    return out.to(torch.int64) & 0xFFFFFFFF

def philox_dropout(shape, key, keep_below, scale):
    "A float32 dropout mask of `shape` from the Philox stream of `key`: `scale` where the draw < `keep_below`, else 0."
    out = torch.empty(shape, dtype=torch.float32)
    fn, k = kernels().philox_dropout, _key_words(key)
    _chunked(lambda lo, hi: fn(out.data_ptr() + 4 * lo, lo, hi - lo, *k, int(keep_below), float(scale)), out.numel(), out.numel())
    return out


# %% [markdown]
# The draws are numpy's, from any starting element and for any count (partial blocks of 8 at both ends), including keys
# with the top bit set; the mask follows the draws; threads do not change it.

# %%
import numpy as np
if kernels() is not None:
    for key in [(0, 0), (123456789, 5), (2**64 - 1, 2**63 + 7)]:
        ref = torch.from_numpy(np.random.Philox(key=np.array(key, dtype=np.uint64)).random_raw(600).view(np.uint32).astype(np.int64))
        for first, n in [(0, 1), (0, 8), (3, 7), (5, 100), (8, 9), (1000, 200)]:
            test_eq(philox_bits(n, key, first), ref[first:first + n])
    key, keep, scale = (42, 7), 3_000_000_000, 1.25
    bits = philox_bits(96 * 17 * 64, key)
    m1 = philox_dropout((96, 17, 64), key, keep, scale)
    test_eq(m1.flatten(), torch.where(bits < keep, scale, 0.0))
    old = torch.get_num_threads(); torch.set_num_threads(2)
    test_eq(philox_dropout((96, 17, 64), key, keep, scale), m1)
    torch.set_num_threads(old)

# %% [markdown]
# ## Torch's own dropout masks, drawn faster
#
# The default path draws its dropout masks as `nn.Dropout` does: `torch.empty(shape).bernoulli_(1 - p)`, then
# `div_(1 - p)`. Where torch's CPU `bernoulli_` loops over elements (as it does on this AMD machine), each element
# costs two words of the generator's MT19937 stream and a float64 comparison, one element at a time through torch's
# generic distribution code: 6–11 ns an element here, a fifth of a 17-token training step. `mt_bernoulli` runs the same
# stream in C (a twist, then the tempering of 624 words at once) on the generator's state bytes and hands the advanced
# state back, so the masks *and* the generator afterwards are torch's bit for bit. Because torch has another route (an
# MKL one) that other CPUs or builds may take, `bernoulli_mask` first checks, once per process, that the kernel reproduces this torch's draws
# (masks and generator state, across a twist); where it does not, torch draws the masks.

# %%
#| export
_MT_CHECK = {}

@functools.lru_cache(maxsize=None)
def _scale(p_keep):
    "1 / p_keep as torch's `div_` rounds it in float32 (a kept element's value)."
    return torch.ones(1).div_(p_keep).item()

def _draw_with_torch(shape, p_keep, generator=None, device="cpu"):
    return torch.empty(shape, device=device).bernoulli_(p_keep, generator=generator).div_(p_keep)

def _draw_with_kernel(shape, p_keep, generator=None):
    gen = torch.default_generator if generator is None else generator
    state, out = gen.get_state(), torch.empty(shape, dtype=torch.float32)
    kernels().mt_bernoulli(out.data_ptr(), out.numel(), state.data_ptr(), float(p_keep), _scale(p_keep))
    gen.set_state(state)
    return out

def mt_kernel_matches_torch(p_keep=0.9) -> bool:
    """Does `mt_bernoulli` reproduce this torch's `bernoulli_(p_keep).div_(p_keep)` (masks and generator state)? Checked
    once per keep probability; False while the kernels are unavailable or switched off."""
    if kernels() is None: return False
    if p_keep not in _MT_CHECK:
        ok = True
        for seed, draws in [(0, [5, 1300, 1]), (12345, [311, 312, 313, 2000])]:
            a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            for n in draws:                                          # odd counts leave a pair across a twist
                ok = ok and torch.equal(_draw_with_kernel((n,), p_keep, a), _draw_with_torch((n,), p_keep, b))
            ok = ok and torch.equal(a.get_state(), b.get_state())
        _MT_CHECK[p_keep] = ok
    return _MT_CHECK[p_keep]

def bernoulli_mask(shape, p_keep, generator=None, device="cpu"):
    """`torch.empty(shape, device=device).bernoulli_(p_keep, generator=generator).div_(p_keep)`, bit for bit and with the
    generator left where torch leaves it: on the CPU through `mt_bernoulli` where it reproduces torch here, else torch."""
    if torch.device(device).type == "cpu" and mt_kernel_matches_torch(p_keep): return _draw_with_kernel(shape, p_keep, generator)
    return _draw_with_torch(shape, p_keep, generator, device)


# %% [markdown]
# The masks equal torch's for shapes of every size (within the first block, across many twists, odd and even counts),
# for several keep probabilities, on the default generator and on a generator of one's own; and the generators end in
# the same state, so whatever is drawn next (the next mask, the next epoch's order) is the same too. On a CPU where the
# kernel does not reproduce torch, the same checks test the fallback.

# %%
print("dropout masks drawn by", "the mt_bernoulli kernel" if mt_kernel_matches_torch() else "torch (the kernel differs here)")
for p_keep in (0.9, 0.5, 0.75):
    for seed in (0, 7):
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for shape in [(1,), (3, 5), (96, 17, 64), (96, 17, 256), (7, 311), (1, 1, 1249)]:
            test_eq(bernoulli_mask(shape, p_keep, a), _draw_with_torch(shape, p_keep, b))
        test_eq(a.get_state(), b.get_state())
torch.manual_seed(3); ref = _draw_with_torch((64, 33), 0.9); after = torch.rand(4)
torch.manual_seed(3); test_eq(bernoulli_mask((64, 33), 0.9), ref); test_eq(torch.rand(4), after)
with use_kernels(False):                                     # kernels off: torch draws, the same masks
    assert not mt_kernel_matches_torch()
    torch.manual_seed(3); test_eq(bernoulli_mask((64, 33), 0.9), ref); test_eq(torch.rand(4), after)

# %% [markdown]
# ## Tests: every kernel against the torch path
#
# The torch implementations (`00b_sparsemax`, `00c_entmax`, `00d_topk`, re-exported by `normalizers`) are checked against
# the `entmax` package and finite differences there.
# Here each kernel must reproduce them in float32 — values and gradients, for rows with masked keys ($-\infty$), ties,
# huge logits, a single valid key, rows longer than 32 (top-k's other selection algorithm) and several threads.

# %%
from sparse_attention_repro import normalizers as N, kernels as KM   # the normalizers call the *module's* kernels
HAVE_KERNELS = KM.kernels() is not None
if not HAVE_KERNELS:                         # no compiler: the torch path serves; under CI the kernels must build
    if os.environ.get("CI"): raise RuntimeError("the C kernels did not build here (under CI they must)")
    print("SKIPPED kernel-vs-torch checks: the C kernels did not build here (no C compiler?); the torch path is in use")

if HAVE_KERNELS:
    def _both(fn, *args):
        "fn(*args) and its gradients, with the kernels and with the torch path."
        out = []
        for on in (True, False):
            with KM.use_kernels(on):
                leaves = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
                y = fn(*leaves); y.backward(_g[:y.numel()].view_as(y))
                out.append((y.detach(), [l.grad for l in leaves if l.requires_grad]))
        return out

    torch.manual_seed(0)
    _g = torch.randn(10**6)
    def _scores(shape, scale=3.0):
        s = torch.randn(shape) * scale
        s[..., 0, 3] = float("-inf"); s[..., 1, :] = 2.0                                # a masked key, an all-tie row
        s[..., 2, 4:] = float("-inf")                                                   # a row with 4 valid keys
        s[..., 3, :] = s[..., 3, :] * 1e4                                               # huge logits
        return s

    for shape in [(4, 3, 9, 17), (2, 4, 6, 97), (1, 2, 4, 200)]:
        s = _scores(shape).requires_grad_()
        a = (1.05 + 0.9 * torch.rand(shape[1])).view(-1, 1, 1).requires_grad_()
        cases = {"sparsemax": lambda s: N.sparsemax(s), "entmax15": lambda s: N.entmax15(s),
                 "entmax_alpha": lambda s, a: N.entmax_alpha(s, a),
                 **{f"topk_{r}": (lambda r: lambda s: N.topk_softmax(s, r))(r) for r in (0.1, 0.125, 0.25, 0.5, 1.0)}}
        for name, fn in cases.items():
            args = (s, a) if name == "entmax_alpha" else (s,)
            (yk, gk), (yt, gt) = _both(fn, *args)
            test_close(yk, yt, eps=2e-6)
            assert ((yk > 0) == (yt > 0)).float().mean() > 0.999, name                  # same support
            for u, v in zip(gk, gt): test_close(u, v, eps=2e-4 * max(1.0, float(v.abs().max())))

# %% [markdown]
# Top-k's search places its split points by guesses (a normal quantile of the row, then ranks interpolated between
# the interval's ends); whatever they guess, the kept keys must be exactly those scoring at least the k-th largest,
# found here by sorting, on rows made to mislead the guesses: heavy tails, one far outlier, few distinct values, a
# constant row, subnormal scores, masked keys; rows of 33, 97 and 200 keys. The flags of the rows softmax makes NaN
# (a NaN, a $+\infty$, no finite score) must equal a pass over the scores.

# %%
if HAVE_KERNELS:
    torch.manual_seed(1)
    for n in (33, 97, 200):
        R = 64
        blocks = [torch.randn(R, n) * 10, (torch.randn(R, n) / torch.rand(R, n)).clamp(-40, 40),
                  torch.randint(0, 4, (R, n)).float(), torch.full((R, n), 0.5), torch.randn(R, n) * 1e-40, torch.randn(R, n)]
        blocks[-1][:, 0] = 40.0                                              # one far outlier
        x = torch.cat(blocks); x[::5, n // 3:] = float("-inf")                # masked keys
        x[1, 2], x[2, 3], x[3] = float("nan"), float("inf"), float("-inf")     # rows softmax makes NaN
        flags = ~torch.isfinite(x.amax(-1, keepdim=True))
        for r in (0.1, 0.125, 0.25, 0.5, 1.0):
            p, bad = topk_softmax_fwd(x, r)
            test_eq(bad, flags)
            good = ~flags.squeeze(-1)
            xs, valid = x[good], x[good] > float("-inf")
            k = N.keep_count(r, valid.sum(-1, keepdim=True))
            kth = xs.sort(-1, descending=True).values.gather(-1, k - 1)
            test_eq(p[good] > 0, xs >= kth)                                # the keys of the k largest, ties included

# %% [markdown]
# The entmax-1.5 kernel's flags of softmax's NaN rows (a NaN or +inf, or no finite score) are the definition's,
# `~isfinite(amax)`, on rows of every kind, short and long, in full and partial lane blocks:

# %%
if HAVE_KERNELS:
    _g = torch.Generator().manual_seed(3)
    for _n in (9, 130):
        _x = torch.randn(4, 37, _n, generator=_g)
        _x[0, :10, 5] = float('nan'); _x[1, :10, 7] = float('inf'); _x[2, :10] = float('-inf')
        _x[3, :5] = float('-inf'); _x[3, :5, 3] = float('nan')
        _p, _bad = entmax15_fwd(_x, flags=True)
        test_eq(_bad, ~torch.isfinite(_x.amax(-1, keepdim=True)))
        test_eq(int(_bad.sum()), 35)

# %% [markdown]
# Masking: `mask_rows` gives torch.where's bits (NaN kept, -0.0 kept, masked NaN and +inf at -inf) for a causal mask
# and a random one over several heads, in one call and chunked over two threads.

# %%
if HAVE_KERNELS:
    _g = torch.Generator().manual_seed(0)
    _s = torch.randn(3, 4, 64, 401, generator=_g)                  # large enough to be chunked over threads
    for _v, _step in ((float('nan'), 7), (float('inf'), 11), (float('-inf'), 13), (-0.0, 17)): _s.view(-1)[::_step] = _v
    for _keep in (torch.arange(401)[None, :] <= torch.arange(337, 401)[:, None], torch.rand(64, 401, generator=_g) > 0.4):
        _ref = torch.where(_keep, _s, float('-inf'))
        for _threads in (1, 2):
            _old = torch.get_num_threads(); torch.set_num_threads(_threads)
            _out = mask_rows(_s, _keep[None, None]); torch.set_num_threads(_old)
            test_eq(torch.equal(_out.isnan(), _ref.isnan()), True)
            test_eq(torch.equal(_out.nan_to_num(), _ref.nan_to_num()) and torch.equal(_out.signbit(), _ref.signbit()), True)

# %% [markdown]
# Threads: the chunked call gives the same result as one call. And the normalizers really dispatch to the kernels for
# float32 — forward and backward — but not for float64 or inside `use_kernels(False)`.

# %%
if HAVE_KERNELS:
    x = torch.randn(96, 4, 97, 97)
    old = torch.get_num_threads()
    torch.set_num_threads(1); one = entmax15_fwd(x)
    torch.set_num_threads(2); two = entmax15_fwd(x)
    torch.set_num_threads(old)
    test_eq(one, two)
    def _calls(f):
        before = KM._state["calls"]; f(); return KM._state["calls"] - before
    xs = x[:2].clone().requires_grad_()
    test_eq(_calls(lambda: N.entmax15(xs).sum().backward()), 2)
    with KM.use_kernels(False): test_eq(_calls(lambda: N.entmax15(xs).sum().backward()), 0)
    test_eq(_calls(lambda: N.sparsemax(x[:2].double())), 0)
    assert not usable(x.double()) and usable(x)

# %% [markdown]
# The fused attention kernel splits its heads over threads too (16 heads per normalizer call on short rows): any split
# gives the same bits, and its weights are the row kernels' weights of the same scores.

# %%
if HAVE_KERNELS:
    for T in (17, 97):
        qkv, go = torch.randn(37, T, 192) * 2, torch.randn(37, T, 64)        # 148 heads: groups of 16 do not divide them
        old = torch.get_num_threads()
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            o, p = attention_fwd(qkv, 4, "topk_softmax", 0.25, ratio=0.25)
            outs.append((o, p, attention_bwd(qkv, p, go, 4, "topk_softmax", 0.25)[0]))
        torch.set_num_threads(old)
        for a, b in zip(*outs): test_eq(a, b)
        q, k, _ = qkv.view(37, T, 3, 4, 16).movedim(-3, 0).transpose(-3, -2)
        test_close(outs[0][1], topk_softmax_fwd((q / 4) @ k.transpose(-2, -1), 0.25)[0], eps=1e-5)

# %% [markdown]
# The block's elementwise kernels against torch's `F.gelu`, `F.layer_norm` and autograd, with and without a dropout
# mask, values and all four gradients, over the range where GELU bends (and far into both tails), with two threads too:

# %%
import torch.nn.functional as F
if HAVE_KERNELS:
    torch.manual_seed(2)
    for threads in (1, 2):
        old = torch.get_num_threads(); torch.set_num_threads(threads)
        u = torch.cat([torch.randn(96, 17, 256) * 3, torch.linspace(-30, 30, 17 * 256).view(1, 17, 256)]).requires_grad_()
        for mask in (None, (torch.rand(u.shape) > 0.1).float() / 0.9):
            g = torch.randn(u.shape)
            ref = F.gelu(u) * (1 if mask is None else mask)
            for mine, theirs in [(gelu_dropout_fwd(u.detach(), mask), ref.detach()),
                                 (gelu_dropout_bwd(u.detach(), mask, g), torch.autograd.grad(ref, u, g)[0])]:
                assert ((mine - theirs).abs() <= 4e-6 * theirs.abs().clamp_min(1)).all()   # a few float32 ulps
        x, h = torch.randn(97, 17, 64).requires_grad_(), (torch.randn(97, 17, 64) * 2).requires_grad_()
        w, b = (1 + 0.3 * torch.randn(64)).requires_grad_(), (0.1 * torch.randn(64)).requires_grad_()
        for mask in (None, (torch.rand(x.shape) > 0.1).float() / 0.9):
            g = torch.randn(x.shape)
            ref = F.layer_norm(x + h * (1 if mask is None else mask), (64,), w, b, 1e-5)
            y, xhat, rstd = residual_layernorm_fwd(x.detach(), h.detach(), mask, w, b, 1e-5)
            test_close(y, ref.detach(), eps=1e-5)
            for mine, theirs in zip(residual_layernorm_bwd(xhat, rstd, mask, w, g), torch.autograd.grad(ref, (x, h, w, b), g)):
                test_close(mine, theirs, eps=1e-4 * max(1.0, float(theirs.abs().max())))
        torch.set_num_threads(old)

# %% [markdown]
# The kernels allocate in float32 whatever torch's default dtype is, and gradients come back in the scores' dtype:

# %%
if HAVE_KERNELS:
    _dd = torch.get_default_dtype(); torch.set_default_dtype(torch.float64)
    try:
        xa = torch.randn(2, 4, 6, 17, dtype=torch.float32).requires_grad_()
        al = torch.tensor([1.2, 1.5, 1.7, 1.9], dtype=torch.float32).view(4, 1, 1).requires_grad_()
        y = N.entmax_alpha(xa, al); y.pow(2).sum().backward()
        test_eq((y.dtype, xa.grad.dtype, al.grad.dtype), (torch.float32,) * 3)
        with KM.use_kernels(False):
            xb, ab = xa.detach().clone().requires_grad_(), al.detach().clone().requires_grad_()
            N.entmax_alpha(xb, ab).pow(2).sum().backward()
        test_close(al.grad, ab.grad, eps=1e-4); test_close(xa.grad, xb.grad, eps=1e-4)
        x32, h32, g32 = (torch.randn(5, 64, dtype=torch.float32) for _ in range(3))     # the block's kernels too
        w32, b32 = torch.ones(64, dtype=torch.float32), torch.zeros(64, dtype=torch.float32)
        y, xhat, rstd = residual_layernorm_fwd(x32, h32, None, w32, b32, 1e-5)
        ref = torch.nn.functional.layer_norm((x32 + h32).double(), (64,))
        test_close(y.double(), ref, eps=1e-5)
        _, _, dw, db = residual_layernorm_bwd(xhat, rstd, None, w32, g32)
        test_close(db, g32.sum(0), eps=1e-5); test_close(dw, (g32 * xhat).sum(0), eps=1e-4)
        test_eq({t.dtype for t in (y, xhat, rstd, dw, db, gelu_dropout_fwd(x32))}, {torch.float32})
    finally: torch.set_default_dtype(_dd)

# %% [markdown]
# **Fallbacks.** Without a C compiler, or with a cache folder that cannot be written, the library warns once (naming the
# cause, and `SPARSE_REPRO_CACHE` for the folder) and every normalizer runs on the torch path with the same results.
# Each case runs in a fresh process, as a user would meet it.

# %%
import subprocess, sys, textwrap
probe = textwrap.dedent("""
    import warnings, torch, entmax
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        from sparse_attention_repro import normalizers as N, kernels as K
        x = torch.randn(8, 4, 17, 17)
        assert torch.allclose(N.sparsemax(x), entmax.sparsemax(x, dim=-1), atol=1e-5)
        assert not K.usable(x) and K._state["calls"] == 0
    print([str(m.message) for m in w if "C kernels unavailable" in str(m.message)])
""")
def _fresh(**env):
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout
with tempfile.TemporaryDirectory() as d:
    out = _fresh(CC="/nonexistent/cc", SPARSE_REPRO_CACHE=d)
    assert "no C compiler found" in out and out.count("C kernels unavailable") == 1, out
    if HAVE_KERNELS:                                  # (without a compiler the build stops before the cache is touched)
        ro = Path(d) / "readonly"; ro.mkdir(); ro.chmod(0o555)
        writable = os.access(ro, os.W_OK)             # root writes anywhere: then a file where the folder should be
        blocker = ro if not writable else Path(d) / "file"
        if writable: blocker.write_text("not a folder")
        out = _fresh(SPARSE_REPRO_CACHE=str(blocker))
        assert "not writable" in out and "SPARSE_REPRO_CACHE" in out, out
        ro.chmod(0o755)
