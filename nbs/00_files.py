# %% [markdown]
# # Writing files safely
# > One atomic write for every file the project produces: a reader never sees half of it, a crash never leaves one.

# %%
#| default_exp files

# %% [markdown]
# Results rows, dataset caches, downloaded splits, manifests and reports are all written the same way: into a temporary
# file beside the target, flushed to disk, then moved onto the target in one `os.replace` (atomic on POSIX). A job
# killed mid-write leaves the previous file intact and no temporary file behind — which is what lets every grid resume.

# %%
#| export
import os, tempfile
from pathlib import Path

# %%
#| export
def atomic_write(path, write):
    "Call `write(tmp_path)` then move the temporary file onto `path` in one step; nothing half-written is ever visible."
    path = Path(path); path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f: os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp): os.remove(tmp)
        raise

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
