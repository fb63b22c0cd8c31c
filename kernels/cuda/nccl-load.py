#!/usr/bin/env python3
"""Real NCCL (the one PyTorch uses) loading cclkit's packaged plugins.

    kernels/cuda/nccl-load.py LIBDIR      # LIBDIR holds the packaged libnccl-*.so

One GPU is enough: each run opens a one-rank communicator, which still makes
NCCL load and initialise its net, tuner, profiler and env plugins, then runs an
all-reduce and a broadcast and checks the data. NCCL's own log lines about
plugins (which ABI version it took, or why it fell back) and the plugins'
lines through NCCL's logger are printed; a run's whole log is printed when it
fails. Exit status: 0 only when every run exited 0 and NCCL named each plugin
it was given. gpu-check.sh runs this as its `nccl-load` step.
"""
import os
import subprocess
import sys
import tempfile


def child():
    """One rank: init, all-reduce, broadcast, check, destroy."""
    import torch
    import torch.distributed as dist

    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    print(f"torch {torch.__version__}, NCCL {nccl}", flush=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    dev = torch.device("cuda:0")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    x = torch.randn(1 << 20, device=dev)
    want = x.clone()
    dist.all_reduce(x)
    dist.broadcast(x, 0)
    torch.cuda.synchronize()
    assert torch.equal(x, want), "a one-rank all-reduce changed the data"
    dist.destroy_process_group()
    print("collectives ok", flush=True)


KEYS = ("plugin", "cclkit", "collectives ok", "torch ", "warn", "error", "fallback")


def run(name, env, expect):
    """Runs the child with NCCL's INFO log; prints the plugin lines."""
    full = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="ALL", **env)
    try:
        p = subprocess.run(
            [sys.executable, __file__, "--child"],
            env=full,
            capture_output=True,
            text=True,
            timeout=150,
        )
        log, code = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        log, code = f"{e.stdout or ''}{e.stderr or ''}\n(timed out after 150 s)", -1
    if isinstance(log, bytes):
        log = log.decode(errors="replace")
    missing = [w for w in expect if w.lower() not in log.lower()]
    ok = code == 0 and not missing
    print(f"== {name}: exit {code}{'' if not missing else f', log lacks {missing}'}")
    lines = log.splitlines()
    shown = lines if not ok else [l for l in lines if any(k in l.lower() for k in KEYS)]
    for line in shown[:200]:
        print("   " + line)
    return ok


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
        return 0
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    lib = os.path.abspath(sys.argv[1])
    net = os.path.join(lib, "libnccl-net-cclkit-socket.so")
    tmp = tempfile.mkdtemp(prefix="cclkit-nccl-")
    prof = os.path.join(tmp, "profile")
    results = [
        run(
            "net (path) + tuner + profiler",
            {
                "NCCL_NET_PLUGIN": net,
                "NCCL_TUNER_PLUGIN": os.path.join(lib, "libnccl-tuner-cclkit.so"),
                "NCCL_PROFILER_PLUGIN": os.path.join(lib, "libnccl-profiler-cclkit.so"),
                "CCLKIT_PROFILE_DIR": prof,
            },
            ["cclkit-socket", "collectives ok"],
        ),
        run(
            "net by name (libnccl-net-<name>.so on LD_LIBRARY_PATH)",
            {
                "NCCL_NET_PLUGIN": "cclkit-socket",
                "LD_LIBRARY_PATH": lib + ":" + os.environ.get("LD_LIBRARY_PATH", ""),
            },
            ["cclkit-socket", "collectives ok"],
        ),
    ]
    toml = os.path.join(tmp, "nccl-env.toml")
    with open(toml, "w") as f:
        f.write(f'[pinned]\nNCCL_NET_PLUGIN = "{net}"\n')
    results.append(
        run(
            "env plugin pinning the net plugin",
            {
                "NCCL_ENV_PLUGIN": os.path.join(lib, "libnccl-env-cclkit.so"),
                "CCLKIT_ENV_FILE": toml,
            },
            ["cclkit-socket", "collectives ok"],
        )
    )
    files = sorted(os.listdir(prof)) if os.path.isdir(prof) else []
    print(f"== profiler files in {prof}: {files if files else 'none'}")
    print(f"== {sum(results)} of {len(results)} runs ok")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
