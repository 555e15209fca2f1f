# %% [markdown]
# # Writing files safely
# > One atomic write for every file the project produces: a reader never sees half of it, a crash never leaves one.

# %%
#| default_exp files

# %% [markdown]
# Results rows, dataset caches, downloaded splits, manifests and reports are all written the same way: into a temporary
# file beside the target, flushed to disk, then moved onto the target in one `os.replace` (atomic on POSIX). A job
# killed mid-write leaves the previous file intact — which is what lets every grid resume.
#
# A kill can come as SIGKILL (a dying node, a scheduler's hard limit, `kill -9`), which no `except` or `finally` sees. So
# where the kernel allows it (Linux `O_TMPFILE`), the temporary file has **no name** while it is written: a kill leaves
# nothing on disk. It gets a name only once complete and flushed, for the two system calls that link it and move it onto
# the target. Elsewhere (other systems, file systems without `O_TMPFILE`) it is a named `.<target>.<random>.tmp` file,
# removed on any exception; only a SIGKILL during the write can leave it, and it is never read as a result.

# %%
#| export
import os, secrets, tempfile
from pathlib import Path

# %%
#| export
def _unnamed_file(folder):
    "An open descriptor of a new file in `folder` that has no name yet (Linux `O_TMPFILE`), or None where that is unsupported."
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"): return None
    try: return os.open(folder, flag | os.O_RDWR, 0o666)
    except OSError: return None          # e.g. a file system without O_TMPFILE support

def _write_unnamed(path, write, fd):
    "Write through `/proc/self/fd/<fd>` while the file is nameless, flush it, then name it and move it onto `path`."
    try:
        write(f"/proc/self/fd/{fd}")
        os.fsync(fd)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:   # a dst_dir_fd makes CPython call linkat(AT_SYMLINK_FOLLOW), which names the file behind the descriptor
            while True:
                tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
                try: os.link(f"/proc/self/fd/{fd}", tmp.name, dst_dir_fd=folder, follow_symlinks=True); break
                except FileExistsError: continue
        finally: os.close(folder)
        try: os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp): os.remove(tmp)
            raise
    finally: os.close(fd)

def _write_named(path, write):
    "The portable route: a named temporary file beside `path`, removed on any exception, moved onto `path` when complete."
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f: os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp): os.remove(tmp)
        raise

def atomic_write(path, write):
    "Call `write(tmp_path)` then move the temporary file onto `path` in one step; nothing half-written is ever visible."
    path = Path(path); path.parent.mkdir(parents=True, exist_ok=True)
    fd = _unnamed_file(path.parent)
    if fd is None: _write_named(path, write)
    else: _write_unnamed(path, write, fd)

def atomic_write_bytes(path, write):
    "`atomic_write` for a writer of an open binary file, `write(fileobj)` (e.g. `np.save`)."
    def to_file(tmp):
        with open(tmp, "wb") as f: write(f)
    atomic_write(path, to_file)

# %%
from fastcore.test import test_eq
d = Path(tempfile.mkdtemp())
atomic_write(d / "sub" / "r.txt", lambda tmp: Path(tmp).write_text("a whole file"))
def boom(tmp):
    open(tmp, "w").write("half a file")
    raise KeyboardInterrupt
try: atomic_write(d / "sub" / "r.txt", boom)
except KeyboardInterrupt: pass
test_eq((d / "sub" / "r.txt").read_text(), "a whole file")          # the old file is intact ...
test_eq(sorted(p.name for p in (d / "sub").iterdir()), ["r.txt"])  # ... and no temporary file is left
atomic_write_bytes(d / "b.bin", lambda f: f.write(b"\x00\x01"))
test_eq((d / "b.bin").read_bytes(), b"\x00\x01")

# %% [markdown]
# Both routes give the same file; the portable one is what non-Linux systems use.

# %%
_write_named(d / "n.txt", lambda tmp: Path(tmp).write_text("named route"))
test_eq((d / "n.txt").read_text(), "named route")

# %% [markdown]
# A writer killed with SIGKILL halfway through its file leaves the old file as it was and, on Linux, no temporary file.
# (A child process writes a first chunk, says so, then waits to be killed.)

# %%
import signal, subprocess, sys, textwrap
k = Path(tempfile.mkdtemp())
(k / "r.csv").write_text("old rows")
child = textwrap.dedent(f"""
    import sys, time
    from sparse_attention_repro.files import atomic_write
    def write(tmp):
        f = open(tmp, "w"); f.write("new rows, half"); f.flush()
        print("writing", flush=True); time.sleep(60)
    atomic_write({str(k / "r.csv")!r}, write)""")
proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
test_eq(proc.stdout.readline().strip(), "writing")
proc.send_signal(signal.SIGKILL); proc.wait()
test_eq((k / "r.csv").read_text(), "old rows")
_fd = _unnamed_file(k)                                              # the nameless route is used here (Linux, O_TMPFILE) ...
if _fd is not None:
    os.close(_fd); test_eq(sorted(p.name for p in k.iterdir()), ["r.csv"])   # ... so nothing but the old file is left

# %% [markdown]
# ## A generated block inside a hand-written page
#
# The README's answer and its leaderboard summary are generated from the committed tables, but they sit inside a page
# people write. Two marker comments fence each block; `sync_block` rewrites only what lies between them, in a markdown file
# or in the markdown cell of a notebook that holds them (the README's source, `nbs/index.ipynb`), atomically, and says
# whether anything changed. A page without the markers is refused in one line that names them.

# %%
#| export
def replace_block(text, block, markers, where, name="generated") -> str:
    "`text` with what lies between the two `markers` replaced by `block`; a `ValueError` naming the markers when the block is missing."
    a, b = markers
    i = text.find(a); j = text.find(b, i + len(a)) if i >= 0 else -1          # the end marker after the start marker
    if i < 0 or j < 0: raise ValueError(f"{where} has no {name} block; add the lines {a} and {b}, in this order, where it belongs")
    return text[:i + len(a)] + "\n" + block + "\n" + text[j:]

def prepare_block(path, block, markers, name="generated"):
    """Check that `path` (a markdown file, or a notebook with the markers in one markdown cell) can take `block` between
    `markers`, without writing: returns a function that writes it (returns True), or None when the page already holds it.
    A writer that also writes other files calls this first, so a page without the block stops it before anything is written."""
    path = Path(path)
    if path.suffix == ".ipynb":
        import nbformat
        nb = nbformat.read(path, as_version=4)
        cells = [c for c in nb.cells if c.cell_type == "markdown" and markers[0] in c.source]
        if not cells: raise ValueError(f"{path} has no {name} block; add the lines {' and '.join(markers)} to one markdown cell")
        new = replace_block(cells[0].source, block, markers, path, name)
        if new == cells[0].source: return None
        cells[0].source = new
        return lambda: atomic_write(path, lambda tmp: nbformat.write(nb, tmp)) or True
    text = path.read_text(encoding="utf-8")
    new = replace_block(text, block, markers, path, name)
    return None if new == text else (lambda: atomic_write(path, lambda tmp: Path(tmp).write_text(new, encoding="utf-8")) or True)

def sync_block(path, block, markers, name="generated") -> bool:
    "Put `block` between `markers` in `path` (a markdown file, or the notebook cell holding them); True when the file changed."
    write = prepare_block(path, block, markers, name)
    return write() if write else False

# %%
from fastcore.test import test_fail
import nbformat
_m = ("<!-- x:start -->", "<!-- x:end -->"); b = Path(tempfile.mkdtemp())
(b / "page.md").write_text(f"# Page\n\n{_m[0]}\nold\n{_m[1]}\n\n## After\n")
assert sync_block(b / "page.md", "new 1\nnew 2", _m) and not sync_block(b / "page.md", "new 1\nnew 2", _m)   # a second run changes nothing
test_eq((b / "page.md").read_text(), f"# Page\n\n{_m[0]}\nnew 1\nnew 2\n{_m[1]}\n\n## After\n")
(b / "bare.md").write_text("# no block\n")
test_fail(lambda: sync_block(b / "bare.md", "new", _m, name="x"), contains="has no x block; add the lines <!-- x:start --> and <!-- x:end -->")
(b / "quoted.md").write_text(f"The end marker {_m[1]} quoted first.\n{_m[0]}\nold\n{_m[1]}\n")   # an end marker before the start is not the block's
sync_block(b / "quoted.md", "new", _m)
test_eq((b / "quoted.md").read_text(), f"The end marker {_m[1]} quoted first.\n{_m[0]}\nnew\n{_m[1]}\n")
(b / "reversed.md").write_text(f"{_m[1]}\n{_m[0]}\n")
test_fail(lambda: sync_block(b / "reversed.md", "new", _m), contains="in this order")
_before = (b / "page.md").read_text(); _w = prepare_block(b / "page.md", "later", _m)
test_eq((b / "page.md").read_text(), _before)                                  # prepared, nothing written yet
assert _w() and "later" in (b / "page.md").read_text()
nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Home"), nbformat.v4.new_markdown_cell(f"## Part\n\n{_m[0]}\nold\n{_m[1]}")]),
               b / "home.ipynb")
assert sync_block(b / "home.ipynb", "new", _m)
test_eq(nbformat.read(b / "home.ipynb", as_version=4).cells[1].source, f"## Part\n\n{_m[0]}\nnew\n{_m[1]}")
