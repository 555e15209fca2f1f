# %% [markdown]
# # Running experiment notebooks
# > Execute parameterised notebooks with papermill, one per task, resumably, and collect their rows into one tidy CSV.

# %%
#| default_exp runner

# %% [markdown]
# Every experiment of the project is a papermill execution of a notebook in `nbs/experiments/` — the executed copy is the
# record of the run. A grid is a list of such tasks (study A: one per dataset × seed; Crisp: one per config × seed).
# The rules that make a long grid survive being killed:
#
# * a notebook writes its rows **atomically** (temporary file + `os.replace`) to rows files of its own, as soon as each
#   result exists — so a task is complete exactly when all the rows files it must produce exist;
# * the tidy results file (`runs.csv`, `crisp_runs.csv`) is *derived*: rebuilt from all rows files after every finished
#   task, again atomically, with duplicates on the key columns impossible by construction;
# * rerunning skips complete tasks and re-executes the others; killing at any moment loses at most the tasks in flight;
# * a failed notebook is kept (papermill writes the error into it) and summarised in one line.
#
# A results folder remembers the options it was made with (`manifest.json`): adding seeds or methods later is fine,
# mixing profiles in one folder is refused.

# %%
#| export
import json, os, tempfile, time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
import pandas as pd
from tqdm.auto import tqdm
from sparse_attention_repro.files import atomic_write

# %%
from fastcore.test import test_eq, test_fail
import tempfile as _tf


# %%
#| export
def save_rows(rows, path):
    "Write result rows (a list of dicts or a DataFrame) as CSV, atomically."
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


# %%
d = Path(_tf.mkdtemp())
save_rows([dict(a=1, b="x"), dict(a=2, b="y")], d / "sub" / "r.csv")
test_eq(pd.read_csv(d / "sub" / "r.csv").to_dict("list"), {"a": [1, 2], "b": ["x", "y"]})
test_eq(sorted(p.name for p in (d / "sub").iterdir()), ["r.csv"])  # written through `files.atomic_write`

# %% [markdown]
# An executed notebook is a record meant to be kept and shared, so it should not name the machine it ran on. Papermill
# stores absolute paths (its input and output paths, and our task parameters such as the rows folder), and stderr
# carries progress bars and library warnings that name installation paths; `scrub_record` rewrites every path under
# the results folder relative to it, and a path elsewhere under the folder the command ran in (a shorter run that a
# grid continues, in a sibling folder) relative to that; it keeps only the file name of papermill's paths and drops
# stderr streams (an error stays: it is an output of its own kind).

# %%
#| export
def scrub_record(nb_path, root, base=None):
    """Rewrite the executed notebook `nb_path` so that paths under `root` are relative to it, other paths under `base` (the
    working directory by default) relative to that, and papermill's paths are bare names."""
    import nbformat                                   # here, not at import: the command line's errors stay quick
    nb = nbformat.read(nb_path, as_version=4)
    meta = nb.metadata.get("papermill", {})
    for k in ("input_path", "output_path"):
        if meta.get(k): meta[k] = Path(meta[k]).name
    for c in nb.cells:
        if c.get("outputs"): c.outputs = [o for o in c.outputs if not (o.output_type == "stream" and o.name == "stderr")]
    root = str(Path(root).resolve())
    text = nbformat.writes(nb).replace(root + os.sep, "").replace(root, ".")
    base = Path(base if base is not None else Path.cwd()).resolve()
    if base.parent != base: text = text.replace(str(base) + os.sep, "")        # never the file system's root
    atomic_write(nb_path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


# %%
import nbformat
nb = nbformat.v4.new_notebook(metadata={"papermill": {"input_path": "/x/nbs/experiments/a.ipynb", "output_path": f"{d}/nbs/a.ipynb"}})
nb.cells = [nbformat.v4.new_code_cell(f'rows_dir = "{d}/rows/a/seed0"\nout = "{d}"', outputs=[
    nbformat.v4.new_output("stream", name="stderr", text="/usr/lib/python3/site-packages/tqdm/auto.py:21: TqdmWarning"),
    nbformat.v4.new_output("stream", name="stdout", text="kept")])]
nbformat.write(nb, d / "rec.ipynb")
scrub_record(d / "rec.ipynb", d)
back = nbformat.read(d / "rec.ipynb", as_version=4)
test_eq(back.cells[0].source, 'rows_dir = "rows/a/seed0"\nout = "."')
test_eq([o.name for o in back.cells[0].outputs], ["stdout"])                 # stderr noise gone, results kept
test_eq(back.metadata.papermill, {"input_path": "a.ipynb", "output_path": "a.ipynb"})
assert str(d) not in (d / "rec.ipynb").read_text()
nb.cells = [nbformat.v4.new_code_cell(f'continue_from = "{d}/shorter/rows/a"\nrows_dir = "{d}/longer/rows/a"')]
(d / "longer").mkdir(); nbformat.write(nb, d / "longer" / "rec.ipynb")
scrub_record(d / "longer" / "rec.ipynb", d / "longer", base=d)                  # a sibling folder: relative to where it ran
test_eq(nbformat.read(d / "longer" / "rec.ipynb", as_version=4).cells[0].source, 'continue_from = "shorter/rows/a"\nrows_dir = "rows/a"')


# %% [markdown]
# ## Collecting rows
#
# The tidy CSV is the concatenation of every rows file, sorted by the key columns. If two rows files ever held the same
# key (they cannot, since each task owns its file), the later file wins.

# %%
#| export
def collect_rows(rows_dir, out_csv, keys):
    "Rebuild `out_csv` from every `*.csv` under `rows_dir`, one row per `keys`; returns the table."
    files = sorted(Path(rows_dir).rglob("*.csv"))
    frames = [pd.read_csv(f, keep_default_na=True) for f in files if f.stat().st_size > 0]
    if not frames: return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True).drop_duplicates(list(keys), keep="last")
    df = df.sort_values(list(keys), kind="stable").reset_index(drop=True)
    save_rows(df, out_csv)
    return df


# %%
save_rows([dict(dataset="b", seed=1, acc=0.5)], d / "rows" / "b" / "seed1.csv")
save_rows([dict(dataset="a", seed=0, acc=0.1), dict(dataset="a", seed=0, acc=0.2)], d / "rows" / "a" / "seed0.csv")
out = collect_rows(d / "rows", d / "runs.csv", ["dataset", "seed"])
test_eq(out[["dataset", "seed", "acc"]].values.tolist(), [["a", 0, 0.2], ["b", 1, 0.5]])
test_eq(pd.read_csv(d / "runs.csv").shape, (2, 3))


# %% [markdown]
# ## The manifest
#
# The options that change what a result *means* (profile, dataset variants, model) are stored in the results folder
# the first time; a later run with different options is refused with one line, before anything is touched. The two
# studies are recorded apart: a folder may hold study A at one profile and Crisp at another (the report gives each
# claim its profile), but never two profiles of one study.

# %%
#| export
def check_manifest(out_dir, study, options: dict, defaults: dict | None = None):
    "Record `options` of `study` in `out_dir/manifest.json`, or raise if the folder holds results made differently."
    path = Path(out_dir) / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {}
    if study in manifest: manifest[study] = {**(defaults or {}), **manifest[study]}   # options added since the folder was made
    old = manifest.get(study)
    if old is not None and "profile" in old and old["profile"] != options.get("profile"):
        raise ValueError(f"{out_dir} holds {study} results of profile {old['profile']!r}, not {options.get('profile')!r}; "
                         f"use another --out folder")
    if old is not None and old != options:
        diff = ", ".join(f"{k}={old.get(k)!r} (now {options.get(k)!r})" for k in sorted(set(old) | set(options))
                         if old.get(k) != options.get(k))
        raise ValueError(f"{out_dir} holds {study} results made with {diff}; use another --out folder")
    manifest[study] = options
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=1, sort_keys=True)))


# %%
check_manifest(d, "study_a", dict(profile="smoke", patch_size=None))
check_manifest(d, "study_a", dict(profile="smoke", patch_size=None))      # same options: fine
check_manifest(d, "crisp", dict(profile="smoke", model="tiny"))
test_fail(lambda: check_manifest(d, "study_a", dict(profile="quick", patch_size=None)), contains="study_a results of profile 'smoke'")
test_fail(lambda: check_manifest(d, "study_a", dict(profile="smoke", patch_size=4)), contains="patch_size=None (now 4)")
test_eq(sorted(json.loads((d / "manifest.json").read_text())), ["crisp", "study_a"])
with _tf.TemporaryDirectory() as d2:
    check_manifest(d2, "study_a", dict(profile="paper")); check_manifest(d2, "crisp", dict(profile="quick"))   # studies apart: fine
    test_fail(lambda: check_manifest(d2, "crisp", dict(profile="paper")), contains="crisp results of profile 'quick'")
check_manifest(d, "study_a", dict(profile="smoke", patch_size=None, pad=False), defaults=dict(pad=False))  # a newer option at its default
test_fail(lambda: check_manifest(d, "crisp", dict(profile="smoke", model="tiny", pad=True), defaults=dict(pad=False)), contains="pad=False (now True)")

# %% [markdown]
# ## Where the experiment notebooks are
#
# In a source checkout the parameterised notebooks are `nbs/experiments/*.ipynb` — the files a developer edits, so an
# editable install always executes the current version. A regular install (`pip install .`, a wheel) has no `nbs/`:
# there the build copies the same notebooks into the package as `sparse_attention_repro/experiments/`.

# %%
#| export
import sparse_attention_repro

def experiments_dir() -> Path:
    "Folder of the parameterised experiment notebooks: the checkout's `nbs/experiments`, else the installed package copy."
    pkg = Path(sparse_attention_repro.__file__).resolve().parent
    for d in (pkg.parent / "nbs" / "experiments", pkg / "experiments"):
        if (d / "study_a.ipynb").is_file(): return d
    raise FileNotFoundError(f"experiment notebooks not found in {pkg.parent / 'nbs' / 'experiments'} or {pkg / 'experiments'}; "
                            f"reinstall the package (pip install sparse_attention_repro or pip install -e . in a checkout)")


# %%
test_eq(sorted(p.name for p in experiments_dir().glob("*.ipynb")), ["crisp.ipynb", "length.ipynb", "report.ipynb", "study_a.ipynb"])

# %% [markdown]
# ## One writer per results folder
#
# Two grids started on the same folder would both run every unfinished notebook — twice the compute for the same rows.
# A command that writes into a results folder holds an exclusive `flock` on `<folder>/.lock` for as long as it runs; a
# second one is refused with one line naming the holder. The kernel drops the lock when its holder exits, however it
# exits (a killed run leaves no stale lock behind).

# %%
#| export
import contextlib, fcntl

class FolderBusyError(ValueError):
    "Another process is writing into the same results folder."

@contextlib.contextmanager
def results_lock(out_dir):
    "Hold the results folder `out_dir` exclusively while the block runs; raise `FolderBusyError` if another process does."
    path = Path(out_dir) / ".lock"; path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    try:
        try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0); holder = f.read().strip() or "another process"
            raise FolderBusyError(f"{out_dir} is in use by {holder}; wait for it to finish or use another --out") from None
        f.seek(0); f.truncate(); f.write(f"pid {os.getpid()} (started {time.strftime('%Y-%m-%d %H:%M:%S')})"); f.flush()
        yield
    finally:
        f.close()                                                    # closing the file releases the lock


# %%
import subprocess, sys, signal
lock_dir = Path(_tf.mkdtemp())
with results_lock(lock_dir):
    test_fail(lambda: results_lock(lock_dir).__enter__(), exc=FolderBusyError, contains=f"in use by pid {os.getpid()}")
with results_lock(lock_dir): pass                                     # released: the folder can be taken again
holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from sparse_attention_repro.runner import results_lock\n"
                           f"with results_lock({str(lock_dir)!r}):\n    print('locked', flush=True); time.sleep(60)"],
                          stdout=subprocess.PIPE, text=True)
test_eq(holder.stdout.readline().strip(), "locked")
test_fail(lambda: results_lock(lock_dir).__enter__(), exc=FolderBusyError, contains=f"pid {holder.pid}")
holder.send_signal(signal.SIGKILL); holder.wait()
with results_lock(lock_dir): pass                                     # a killed holder leaves no stale lock


# %% [markdown]
# ## Tasks and execution
#
# A task names a notebook, its parameters, where the executed copy goes and which rows files mark it done. `run_tasks`
# skips finished tasks, executes the rest (in parallel threads — each papermill execution runs in its own kernel process),
# refreshes the tidy CSV after each one and returns one line per failure.

# %% [markdown]
# A kernel can die before it answers: each kernel's ports are chosen free and bound a moment later by the kernel, and
# another process can take one in between (`Address already in use`). No cell has run then, so the task starts a fresh
# kernel, up to `KERNEL_START_TRIES` times; any other failure is the notebook's own and is reported at once. On a busy
# machine (every core training) a kernel can take more than papermill's default minute to import torch and answer: it
# is given `KERNEL_START_SECONDS`, and one that still has not answered is started again like one that died.

# %%
#| export
@dataclass
class NotebookTask:
    "One papermill execution: `notebook` with `parameters` -> `output`; done when every path in `produces` exists."
    name: str
    notebook: Path
    output: Path
    produces: list
    parameters: dict = field(default_factory=dict)

    @property
    def done(self): return all(Path(p).exists() for p in self.produces)

def _error_line(exc):
    "One line describing why a notebook failed."
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    if ename: return f"{ename}: {str(evalue).splitlines()[0] if evalue else ''}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

KERNEL_START_TRIES = 3
KERNEL_START_SECONDS = 300      # papermill waits a minute by default; a kernel importing torch on a busy machine can take longer

def _kernel_never_started(exc):
    "The kernel died, or did not answer, before any cell ran: starting it again is safe."
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in ("Kernel died before replying to kernel_info", "Kernel didn't respond in"))

def execute_task(task: NotebookTask, kernel_name="python3"):
    "Execute one task with papermill; returns None on success, else a one-line error."
    import papermill as pm
    Path(task.output).parent.mkdir(parents=True, exist_ok=True)                  # task paths are absolute (see the CLI)
    for attempt in range(KERNEL_START_TRIES):
        try:
            # no `cwd=`: papermill would os.chdir the whole process, which races between parallel tasks
            pm.execute_notebook(str(task.notebook), str(task.output), kernel_name=kernel_name, language="python",
                                progress_bar=False, parameters=task.parameters, start_timeout=KERNEL_START_SECONDS,
                                extra_arguments=["--IPKernelApp.log_level=CRITICAL"])   # no kernel log noise
            break
        except Exception as e:
            if _kernel_never_started(e) and attempt + 1 < KERNEL_START_TRIES: continue
            return _error_line(e)
    if not task.done: return "notebook finished without writing its rows"
    return None

# %% [markdown]
# The messages are jupyter_client's own (a kernel that died before its first reply, one that did not answer in time);
# a notebook's own error, even one that mentions a kernel, is not retried:

# %%
import jupyter_client.client, inspect
_src = inspect.getsource(jupyter_client.client)
assert "Kernel died before replying to kernel_info" in _src and "Kernel didn't respond in" in _src
test_eq([_kernel_never_started(e) for e in (RuntimeError("Kernel died before replying to kernel_info"),
                                             RuntimeError("Kernel didn't respond in 300 seconds"),
                                             RuntimeError("the kernel of my model diverged"), ValueError("Kernel didn't respond in 1 seconds"))],
        [True, True, False, False])

# %% [markdown]
# For executors on other machines, a task runs in a private temporary folder there: parameters that point into the
# results folder are rewritten to point into it, and the executed notebook and rows come back as bytes.

# %%
#| export
def _under(value, base):
    return isinstance(value, str) and (value == str(base) or value.startswith(str(base) + os.sep))

def execute_task_portable(task: NotebookTask, notebook_text: str):
    "Execute `task` in a private temporary folder (on any machine); return (error, {path: bytes}) for the driver to write."
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = os.path.commonpath([str(Path(p).parent) for p in task.produces])
        above = [v for v in task.parameters.values() if isinstance(v, str) and v and _under(base, v)]
        base = Path(min(above, key=len) if above else base)      # a folder parameter above the rows (one per seed) maps too
        local_path = lambda v: str(tmp / "rows" / Path(v).relative_to(base))
        params = {k: local_path(v) if _under(v, base) else v for k, v in task.parameters.items()}
        (tmp / "template.ipynb").write_text(notebook_text)
        local = NotebookTask(task.name, tmp / "template.ipynb", tmp / "out" / Path(task.output).name,
                             [Path(local_path(str(p))) for p in task.produces], params)
        err = execute_task(local)
        files = {str(task.output): local.output.read_bytes()} if local.output.exists() else {}
        if err is None: files.update({str(p): Path(lp).read_bytes() for p, lp in zip(task.produces, local.produces)})
        return err, files

# %% [markdown]
# The driver writes what a remote task returned, each file atomically and the rows files — the completion markers — last.

# %%
#| export
def _write_files(files):
    "Write the files a remote task returned, each atomically; rows files (the completion markers) last."
    for path in sorted(files, key=lambda p: p.endswith(".csv")):
        atomic_write(path, lambda tmp, data=files[path]: Path(tmp).write_bytes(data))

# %% [markdown]
# Two executors behind one interface (submit, completion order, result, close): local threads that each drive one
# papermill kernel process, or a dask.distributed cluster (an existing one, or a local one of single-threaded workers).

# %%
#| export
def _local_pool(jobs):
    "Threads that each drive one papermill kernel process."
    pool = ThreadPoolExecutor(max(1, jobs))
    return (lambda task: pool.submit(execute_task, task)), as_completed, (lambda fut: (fut.result(), None)), pool.shutdown

def _dask_pool(jobs, scheduler):
    "dask.distributed: an existing cluster at `scheduler`, or a LocalCluster of `jobs` single-threaded workers."
    from dask.distributed import Client, LocalCluster, as_completed as dask_completed
    cluster = None if scheduler else LocalCluster(n_workers=max(1, jobs), threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(scheduler or cluster)
    texts = {}
    def submit(task):
        text = texts.setdefault(task.notebook, Path(task.notebook).read_text())
        return client.submit(execute_task_portable, task, text, pure=False, key=f"notebook-{task.name}-{time.time_ns()}")
    def close():
        client.close()
        if cluster is not None: cluster.close()
    return submit, dask_completed, (lambda fut: fut.result()), close

# %% [markdown]
# `run_tasks` skips finished tasks, submits the rest, and after each one that finishes scrubs its record, refreshes the
# tidy CSV and reports a failure in one line. `run_task_groups` does the same for several results folders from one
# pool, so that grids of a few tasks each (the tuned-recipe grids: one folder per learning rate) keep every worker busy
# instead of waiting for the slowest task of each grid.

# %%
#| export
@dataclass
class TaskGroup:
    "The tasks of one results folder: where their tidy CSV and rows go, the row keys, and the prefix of their failure names."
    tasks: list
    out_csv: Path
    keys: tuple
    rows_dir: Path
    scrub_root: Path | None = None
    name: str = ""

def run_task_groups(groups, jobs=1, executor="local", scheduler=None, progress=True, desc="runs", order=None):
    """Run the unfinished tasks of every `TaskGroup` from one pool; keep each group's CSV up to date; return {name: error}.
    Tasks start group by group, or sorted by `order(task)` (stable) where given."""
    pending = [(g, t) for g in groups for t in g.tasks if not t.done]
    if order is not None: pending.sort(key=lambda gt: order(gt[1]))
    total = sum(len(g.tasks) for g in groups)
    if len(pending) < total and progress: print(f"{total - len(pending)} of {total} tasks already done; resuming")
    for g in groups:
        if not any(not t.done for t in g.tasks) and any(t.done for t in g.tasks): collect_rows(g.rows_dir, g.out_csv, g.keys)
    failures = {}
    if not pending: return failures
    if executor not in ("local", "dask"): raise ValueError(f"unknown executor {executor!r}; choose local or dask")
    submit, completed, result, close = _local_pool(jobs) if executor == "local" else _dask_pool(jobs, scheduler)
    try:
        futures = {submit(t): (g, t) for g, t in pending}
        with tqdm(total=len(pending), desc=desc, disable=not progress) as bar:
            for fut in completed(list(futures)):
                g, task = futures[fut]
                try: err, files = result(fut)
                except Exception as e: err, files = _error_line(e), None
                if files: _write_files(files)
                if g.scrub_root is not None and Path(task.output).exists(): scrub_record(task.output, g.scrub_root)
                name = f"{g.name}:{task.name}" if g.name else task.name
                if err: failures[name] = err; tqdm.write(f"FAILED {name}: {err} (see {task.output})")
                else: collect_rows(g.rows_dir, g.out_csv, g.keys)
                bar.update()
    finally:
        close()
    return failures

def run_tasks(tasks, out_csv, keys, rows_dir, jobs=1, executor="local", scheduler=None, progress=True, desc="runs",
              scrub_root=None):
    "Run the unfinished `tasks` (`executor` local threads or dask); keep `out_csv` up to date; return {task name: error}."
    return run_task_groups([TaskGroup(list(tasks), out_csv, keys, rows_dir, scrub_root)], jobs, executor, scheduler, progress, desc)


# %% [markdown]
# A real papermill execution of a two-cell notebook: the task writes its rows, a rerun skips it, and a failing task
# is reported with its exception in one line while its executed notebook is kept.

# %%
import nbformat
nb = nbformat.v4.new_notebook()
params = nbformat.v4.new_code_cell('x = 1\nrows_path = "r.csv"'); params.metadata["tags"] = ["parameters"]
nb.cells = [params, nbformat.v4.new_code_cell(
    "from sparse_attention_repro.runner import save_rows\n"
    "if x < 0: raise ValueError('x must be >= 0')\n"
    "save_rows([dict(x=x, y=x * x)], rows_path)")]
nbformat.write(nb, d / "square.ipynb")
tasks = [NotebookTask(f"x{x}", d / "square.ipynb", d / "nbs" / f"x{x}.ipynb", [d / "rows2" / f"x{x}.csv"],
                      dict(x=x, rows_path=str(d / "rows2" / f"x{x}.csv"))) for x in (2, 3, -1)]
fails = run_tasks(tasks, d / "squares.csv", ["x"], d / "rows2", jobs=2, progress=False, scrub_root=d)
test_eq(fails, {"x-1": "ValueError: x must be >= 0"})
assert str(d) not in (d / "nbs" / "x2.ipynb").read_text()          # the kept records name no machine path
test_eq(pd.read_csv(d / "squares.csv").values.tolist(), [[2, 4], [3, 9]])
assert (d / "nbs" / "x-1.ipynb").exists()
mtime = (d / "rows2" / "x2.csv").stat().st_mtime
test_eq(run_tasks(tasks[:2], d / "squares.csv", ["x"], d / "rows2", progress=False), {})
test_eq((d / "rows2" / "x2.csv").stat().st_mtime, mtime)          # done tasks are not re-run
# two results folders from one pool: each keeps its own CSV; failure names carry their group's name
_g = [TaskGroup([NotebookTask(f"x{x}", d / "square.ipynb", d / f"g{k}" / f"x{x}.ipynb", [d / f"g{k}" / "rows" / f"x{x}.csv"],
                              dict(x=x, rows_path=str(d / f"g{k}" / "rows" / f"x{x}.csv"))) for x in xs],
                d / f"g{k}" / "out.csv", ["x"], d / f"g{k}" / "rows", d, name=f"g{k}") for k, xs in enumerate([(4, 5), (6, -3)])]
test_eq(run_task_groups(_g, jobs=2, progress=False), {"g1:x-3": "ValueError: x must be >= 0"})
test_eq([pd.read_csv(d / f"g{k}" / "out.csv").values.tolist() for k in (0, 1)], [[[4, 16], [5, 25]], [[6, 36]]])
# `order` sets the start order across groups (one job: the finishing order too)
_o = [TaskGroup([NotebookTask(f"x{x}", d / "square.ipynb", d / f"o{k}" / f"x{x}.ipynb", [d / f"o{k}" / "rows" / f"x{x}.csv"],
                              dict(x=x, rows_path=str(d / f"o{k}" / "rows" / f"x{x}.csv"))) for x in xs],
                d / f"o{k}" / "out.csv", ["x"], d / f"o{k}" / "rows", d, name=f"o{k}") for k, xs in enumerate([(7, 8), (9,)])]
test_eq(run_task_groups(_o, jobs=1, progress=False, order=lambda t: -t.parameters["x"]), {})
_mt = {x: (d / f"o{k}" / "rows" / f"x{x}.csv").stat().st_mtime_ns for k, xs in enumerate([(7, 8), (9,)]) for x in xs}
assert _mt[9] < _mt[8] < _mt[7], _mt

# %% [markdown]
# A kernel that dies before it answers is started again. The kernel below is a real ipykernel behind a launcher that
# exits at once on its first start, as a kernel does when its port was taken.

# %%
import json, sys
_kdir = d / "jupyter" / "kernels" / "dies_once"; _kdir.mkdir(parents=True)
(_kdir / "launch.py").write_text(
    "import pathlib, runpy, sys\n"
    f"marker = pathlib.Path({str(d / 'died')!r})\n"
    "if not marker.exists(): marker.touch(); sys.exit(1)\n"
    "sys.argv = ['ipykernel_launcher'] + sys.argv[1:]\n"
    "runpy.run_module('ipykernel_launcher', run_name='__main__')\n")
(_kdir / "kernel.json").write_text(json.dumps(dict(argv=[sys.executable, str(_kdir / "launch.py"), "-f", "{connection_file}"],
                                                    display_name="dies once", language="python")))
_old_path = os.environ.get("JUPYTER_PATH")
os.environ["JUPYTER_PATH"] = str(d / "jupyter")
try:
    _t = NotebookTask("x11", d / "square.ipynb", d / "nbs" / "x11.ipynb", [d / "rows2" / "x11.csv"],
                      dict(x=11, rows_path=str(d / "rows2" / "x11.csv")))
    test_eq(execute_task(_t, kernel_name="dies_once"), None)
    assert (d / "died").exists()                                      # the first start did die
    test_eq(pd.read_csv(d / "rows2" / "x11.csv").values.tolist(), [[11, 121]])
finally:
    if _old_path is None: os.environ.pop("JUPYTER_PATH")
    else: os.environ["JUPYTER_PATH"] = _old_path

# %% [markdown]
# For executors on other machines (dask), a task runs in a private temporary folder and sends its executed notebook and
# rows back as bytes; the driver writes them, atomically, where a local run would have. Nothing needs a shared filesystem.

# %%
t = NotebookTask("x5", d / "square.ipynb", d / "nbs" / "x5.ipynb", [d / "rows2" / "x5.csv"], dict(x=5, rows_path=str(d / "rows2" / "x5.csv")))
err, files = execute_task_portable(t, (d / "square.ipynb").read_text())
test_eq((err, sorted(files)), (None, sorted([str(t.output), str(t.produces[0])])))
assert not t.done                                                      # nothing written on the "worker" side ...
_write_files(files)
test_eq(pd.read_csv(t.produces[0]).values.tolist(), [[5, 25]])         # ... until the driver writes what came back
err, files = execute_task_portable(NotebookTask("x-2", d / "square.ipynb", d / "nbs" / "x-2.ipynb", [d / "rows2" / "x-2.csv"],
                                                dict(x=-2, rows_path=str(d / "rows2" / "x-2.csv"))), (d / "square.ipynb").read_text())
test_eq((err, list(files)), ("ValueError: x must be >= 0", [str(d / "nbs" / "x-2.ipynb")]))   # failed notebook kept, no rows

# a folder parameter above the rows (the study A notebook writes `rows_dir/seed<k>/<method>.csv`) is mapped too
nb_sub = nbformat.v4.new_notebook()
params = nbformat.v4.new_code_cell('x = 1\nrows_dir = "r"'); params.metadata["tags"] = ["parameters"]
nb_sub.cells = [params, nbformat.v4.new_code_cell("from sparse_attention_repro.runner import save_rows\n"
                                                  "save_rows([dict(x=x)], f'{rows_dir}/seed{x}/x.csv')")]
t = NotebookTask("x7", d / "sub.ipynb", d / "nbs" / "x7.ipynb", [d / "rows3" / "seed7" / "x.csv"], dict(x=7, rows_dir=str(d / "rows3")))
err, files = execute_task_portable(t, nbformat.writes(nb_sub))
test_eq((err, sorted(files)), (None, sorted([str(t.output), str(t.produces[0])])))
assert not (d / "rows3").exists()
