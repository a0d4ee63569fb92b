"""Every cause of a miss and every reason a compile is not cached, with its fix: the one vocabulary
that the explainer, the seams, the recorder, ``explain``, ``stats``, the report line and the API
share (SPEC §13.1)."""

from gkx_autocache._jax.hooks import HOOK

# The causes of a miss (the explainer names one for each).
NEW = "new"
EVICTED = "evicted"
CANNOT_TELL = "cannot tell"  # with "by": what the evidence cannot tell apart (place, record, alias, lambda, jax)
REJECTED = "rejected"  # the entry was there and could not be used
NOT_READ = "not read: XLA dump"  # the process reads no entry: a hit would skip the dump it asks for
NOT_READ_SUBSET = "not read: TPU device subset"  # a warm read there can crash the runtime (jax-ml/jax#38004)
UNEXPLAINED = "unexplained"
BEFORE_CPU_KEYING = "before CPU keying"
CHANGED_COMPUTATION = "changed computation"
CHANGED_XLA_FLAGS = "changed XLA_FLAGS"
CHANGED_LIBTPU_INIT_ARGS = "changed LIBTPU_INIT_ARGS"
CHANGED_LIBTPU = "changed libtpu"  # another build of libtpu: JAX keys its build line
CHANGED_TPU_TOPOLOGY = "changed TPU topology"
CHANGED_JAX = "changed JAX"
CHANGED_CPU = "changed CPU"
CHANGED_DEVICE_ASSIGNMENT = "changed device assignment"
CHANGED_COMPILE_OPTIONS = "changed compile options"


def changed(label: str) -> str:
    """The cause for a key part that differs, by its label (``jaxlib``, ``backend``, ``devices``...)."""
    return f"changed {label}"


# Why a compile is not cached (JAX does not write it, or the store cannot): shown as "not cached: <reason>".
NOT_PROCESS_0 = "not process 0"
HOST_CALLBACKS = "host callbacks"
BELOW_MIN_COMPILE_TIME = "below min_compile_time_secs"
BELOW_MIN_ENTRY_SIZE = "below min_entry_size_bytes"
READ_ONLY = "read-only directory"
WRITE_FAILED = "write failed"
NOT_CACHED = "not cached: "


def not_cached(reason: str) -> str:
    return NOT_CACHED + reason


# What put host callbacks in a function, by the library whose function they call (``_jax.callbacks.callbacks_by``).
CALLBACKS_BY = {"jax": "(jax.debug.print, pure_callback or io_callback)",
                "equinox": "of equinox's runtime checks (eqx.error_if, as in every diffrax solve)",
                "__main__": "of the program itself"}


def callbacks_fix(by: str | None = None, detail: str = "") -> str:
    """The fix for host callbacks that keep a function uncached: by the library that put them there
    (``by``) and why they are kept (``detail``: the line, TPU, or a seam of JAX's that changed)."""
    if " on tpu " in detail:
        way = "upgrade JAX to 0.11 or later (Python 3.12+), which caches them on TPU"
    elif "has changed" in detail or "is missing" in detail:
        way = ("report it: this JAX's internals are not the ones gkx-autocache knows (a newer or patched JAX; "
               "gkx-autocache status names the one that changed)")
    else:
        way = ("upgrade JAX to 0.8.1 or later, where gkx-autocache caches them (Python 3.11 installs up to 0.10.2; "
               "JAX 0.11, which caches them itself, needs Python 3.12)")
    if by == "equinox":
        return (f"set EQX_ON_ERROR=nan: equinox's runtime checks then give NaNs instead of raising an error, and the "
                f"function is cached; or {way}")
    return f"{way}; or keep them out of hot functions"


FIXES = {
    NEW: "nothing to fix: its first entry here; the next run is served",
    CHANGED_COMPUTATION: "nothing to fix when you changed the code, the shapes or jax.config; a value that differs "
                         "on every run (a time, a seed, an id()) closed over by the function makes it miss every "
                         "time: pass it as an argument",
    f"{CHANGED_COMPUTATION}:donated": "nothing to fix if you changed which arguments are donated (donate_argnums, "
                                      "donate_argnames, equinox's donate): each choice has its own entry",
    f"{CHANGED_COMPUTATION}:sharded": "nothing to fix if you placed the inputs otherwise (another PartitionSpec, mesh "
                                      "axis or in_shardings): each placement has its own entry",
    CHANGED_XLA_FLAGS: "keep XLA_FLAGS (and --xla arguments) the same between runs: every entry depends on them",
    CHANGED_LIBTPU_INIT_ARGS: "set the same LIBTPU_INIT_ARGS between runs: every entry depends on them, as on XLA_FLAGS "
                              "(gkx-autocache ci-key keys a CI cache by them)",
    CHANGED_LIBTPU: "nothing to fix: the entries were built by another libtpu build, which JAX keys (its build line), "
                    "and each build compiles its own; in CI, pin libtpu (gkx-autocache ci-key keys by its version)",
    CHANGED_TPU_TOPOLOGY: "each TPU slice (its chips and topology) has its own entries: key a CI cache by the topology, "
                          "which gkx-autocache ci-key holds, so that a v6e-1 job's cache is not restored for v6e-4 jobs",
    changed("jaxlib"): "entries of another jaxlib are never hit: expected after an upgrade",
    CHANGED_JAX: "expected after an upgrade; what lowers the same under the new JAX is compiled ahead from the old "
                 "directory's records (rebuild ahead, or gkx-autocache rebuild); gkx-autocache prune --stale-versions "
                 "removes the old directory once unused for 30 days",
    changed("backend"): "entries of another backend version are never hit: expected after a driver or plugin upgrade",
    changed("devices"): "the device kinds or count differ (CUDA_VISIBLE_DEVICES, "
                        "--xla_force_host_platform_device_count, jax_num_cpu_devices): each set has its own entries",
    f"{changed('devices')}:mesh": "nothing to fix if you changed the devices the computation runs on (a Mesh over "
                                  "other devices or another number of them, pmap's devices): the compile options "
                                  "follow them (num_partitions, the device assignment), and each set has its own "
                                  "entries; a run on the devices of an earlier one is served",
    CHANGED_DEVICE_ASSIGNMENT: "expected for ranks other than 0 of a multi-process run on CPU (JAX keys the device "
                               "assignment there; on GPU it does not)",
    CHANGED_COMPILE_OPTIONS: "compile options set in code or jax.config differ between runs",
    changed("compression"): "installing or removing zstandard changes every key: keep it the same",
    changed("custom hook"): f"{HOOK}() returns something else",
    CHANGED_CPU: "expected on another CPU: its entries are built for the CPU that compiled them, and are never "
                 "loaded where they could not run; each CPU keeps its own",
    BEFORE_CPU_KEYING: "nothing to fix: once per entry after upgrading to a gkx-autocache that keys CPU entries by "
                       "the CPU's instruction set (or after stock JAX wrote the directory)",
    CANNOT_TELL: "the evidence cannot decide: run your code from a module file (not a notebook cell or python -c) "
                 "to tell functions of one name apart",
    f"{CANNOT_TELL}:record": "the evidence cannot decide: entries without a record (stock JAX, an older gkx-autocache, a "
                             "process not finished) are compared once a gkx-autocache process has recorded them",
    f"{CANNOT_TELL}:moved": "nothing to fix if you renamed or moved the file: a rename alone misses nothing (keys "
                            "hold no paths), so the miss is what differs from the old file's closest entry, said above",
    f"{CANNOT_TELL}:alias": "the evidence cannot decide: import a module one way (model.core), not also by putting its "
                            "folder on sys.path (core), so that its functions have one place",
    f"{CANNOT_TELL}:lambda": "the evidence cannot decide: give the function a name (def) to tell it from the file's "
                             "other lambdas",
    f"{CANNOT_TELL}:jax": "the evidence cannot decide: nothing to fix if you upgraded JAX; if not, its first entry here",
    REJECTED: "the entry could not be loaded; it was compiled again and replaced (gkx-autocache verify checks the rest)",
    UNEXPLAINED: "JAX's key parts were not seen for this compile",
    NOT_READ: "expected while XLA_FLAGS asks for a dump: a hit would skip XLA and its dump, so the process reads no "
              "entry (it still writes them); the next run without the flag is served",
    NOT_READ_SUBSET: "expected on TPU devices without device 0: a warm read there can crash the TPU runtime "
                     "(jax-ml/jax#38004, open), so such lookups read no entry until a fixed libtpu is known; their "
                     "compiles are still written, and a run whose devices include device 0 is served",
    NOT_PROCESS_0: "expected: only process 0 of a multi-process run writes (JAX's rule)",
    HOST_CALLBACKS: callbacks_fix(),
    READ_ONLY: "expected: the cache is read-only for you (a baked image)",
}
# The fix for an eviction, by who removed the entry.
EVICTED_BY = {"max_size": "the cap is smaller than the working set: raise max_size ({how})",
              "prune": "removed by gkx-autocache prune: nothing to fix (prune less, or raise --max-size)",
              "verify": "removed by gkx-autocache verify --repair because it did not load: nothing to fix",
              "outside": "someone or something outside gkx-autocache removed it (a person, a cleanup job, another "
                         "tool)"}
EVERY_RUN = ("misses on every run, with nothing changed between the runs (its inputs, its files, the command line, the "
             "environment): a value that differs on every run (a time, a seed, an id(), a random choice) is closed over "
             "by the function or passed as a static argument: pass it as an ordinary (traced) argument, or fix it")
