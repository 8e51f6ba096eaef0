"""fusedattn-select benchmark: one command, one run, every figure side by side.

    python -m tools.bench [--out DIR] [--quick] [--budget SECONDS] [--sections 1,2,5]
    python -m tools.bench --render DIR/bench.json      # bench.md again, from the JSON alone

Measures on the GPU machine and writes DIR/bench.json and DIR/bench.md (DIR: --out, else $OUT,
else ./bench-out), plus DIR/bench.log with the output of every measuring subprocess:

  1. selection latency   get_backend() on a cached config vs torch._fused_sdp_choice and
                         torch.backends.cuda.can_use_cudnn_attention on the same shape
  2. probe cost          process init (first cuDNN call), cold fast / full probes per graph for
                         every configs/ entry, the same graph again in-process (memory cache hit,
                         rebuild with a warm kernel cache); one fresh process per config file
  3. warm start          a whole model file (selection of every entry + one forward+backward
                         attention() step) in a fresh process, with an empty vs a warmed
                         persistent cache
  4. warmup scaling      warmup(depth="full") of a probe-suite subset with 1, 2, 4, 8 jobs,
                         each in a fresh process with an empty cache directory
  5. dispatch            forward / backward / forward+backward time and TFLOPS of attention() vs
                         raw cudnn-frontend graph execution vs torch SDPA backends; FP8 vs bf16;
                         per-call host overhead on a tiny problem
  6. plan rebuild        building the graph for a new batch size or sequence length (dynamic
                         shapes, kernel cache) vs a cold build

Every figure is a median over repetitions with its spread; every comparison is a ratio of two
medians measured in the same run. The benchmark never asserts speed: it reports. Each section
(and each item inside one) records "failed: reason" instead of aborting the run, and the run
keeps to a time budget (default 460 s, --quick 175 s): what does not fit is "skipped: time budget".

Measurements run in subprocesses (`python -m tools.bench --worker NAME`), so "cold" means a fresh
process and a crash in one section cannot take the others down. Workers run with
CUDA_CACHE_DISABLE=1 so the driver's on-disk JIT cache cannot make a later process look warmer
than the first one.

Modules: `common` (statistics, formatting, result status, timing), `options` (arguments, what each
mode measures, time budget), `runner` (worker subprocesses), `document` (the JSON schema and the
markdown report), `main` (the run), and one module per section: `environment`, `selection`,
`probe_cost`, `warm_start`, `warmup_scaling`, `dispatch` (with `fp8`, `host_overhead`,
`raw_graph`, `tensors`), `plan_rebuild`; `problems` picks the configs they measure.

No module imports torch, cuDNN or fusedattn_select at import time: workers import them inside the
measurement (the warm-start section times those imports), and the pure parts (statistics,
formatting, arguments, the JSON schema, the report) run without a GPU; tests/tools/ covers them.
"""
