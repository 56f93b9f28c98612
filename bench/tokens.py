"""Token corpora (issue 48): riffle against the loaders language models use,
on one synthetic corpus in Megatron's layout (bench/tokgen: 10^9 tokens in
10^6 documents, made here and deleted at the end unless --keep), each figure
a ratio against a baseline of the same run.

  first   the time from nothing open to the first batch (8 x 2048 tokens)
          and the memory it holds: riffle.torch (concat, best_fit; a fresh
          daemon each, its Go heap and anonymous RSS growth read from its
          status while the client holds the batch), riffle load (a whole
          epoch in one process), Megatron-LM's GPTDataset built by its
          BlendedMegatronDatasetBuilder (its index build; then a second run
          loading the cached index), nanoGPT's get_batch
  speed   tokens/s of riffle.torch (concat) against nanoGPT's get_batch, for
          --seconds each, cold (the page cache dropped first) and warm
  memory  the daemon's index memory per document (the growth from a 10^5-
          to a 10^6-document corpus), Megatron's index bytes per document,
          and the state's size in bytes

Each part runs --repeats times, interleaved, and prints the median and the
range with the load average seen; every loader runs in its own process.

    PATH=/usr/local/go/bin:$PATH make build
    .venv/bin/python bench/tokens.py --dir /tmp/riffle-tokens --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import REPO, Daemon, drop_caches  # noqa: E402

SEQ, BATCH, SEED = 2048, 8, 3


def rss_kb(pid: int | str = "self") -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def load() -> float:
    return float(open("/proc/loadavg").read().split()[0])


# --- the loaders, each run in a child process (--child NAME) ---

def megatron():
    """megatron-core's GPTDataset, its builder and config, importable on torch 1.13 as corpus/testdata/writers.py
    makes its datasets package (its training stack, which needs torch>=2, left out). GPTDataset, the builder and
    the compiled helpers (helpers_cpp, shipped in the wheel) are megatron-core's own code, unchanged."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("riffle_writers", REPO / "corpus" / "testdata" / "writers.py")
    writers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writers)
    writers.importable_megatron()
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    return BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig


class Tokenizer:
    """What GPTDataset asks of a tokenizer: its vocabulary's size and end of document (GPT-2's)."""
    vocab_size, eod = 50257, 50256
    unique_identifiers = {"class": "Tokenizer", "vocab_size": 50257}  # in the hash naming the cached index


def samples_per_epoch(prefix: str) -> int:
    import numpy as np
    with open(prefix + ".idx", "rb") as f:
        head = f.read(34)
    n = int.from_bytes(head[18:26], "little")
    lens = np.fromfile(prefix + ".idx", np.int32, count=n, offset=34)
    return (int(lens.sum(dtype=np.int64)) - 1) // SEQ  # Megatron's: each sample SEQ+1 tokens, sharing the last


def child_megatron(prefix: str, cache: str, epochs: int = 1) -> dict:
    """GPTDataset built for epochs epochs' samples (a training run's: its index covers them all) by the
    builder, and its first batch; with its index in cache already, loaded from there."""
    Builder, GPTDataset, Config = megatron()
    import numpy as np
    n = epochs * samples_per_epoch(prefix)
    r0, t0 = rss_kb(), time.perf_counter()
    cfg = Config(random_seed=SEED, sequence_length=SEQ, blend=([prefix], None), split="100,0,0", tokenizer=Tokenizer(),
                 reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                 create_attention_mask=False, path_to_cache=cache)
    train, _, _ = Builder(GPTDataset, [n, None, None], lambda: True, cfg).build()
    batch = [train[i] for i in range(BATCH)]
    ms = (time.perf_counter() - t0) * 1e3
    assert all(b["tokens"].shape == (SEQ,) for b in batch)
    idx = {k: int(np.asarray(getattr(train, k)).nbytes) for k in ("document_index", "sample_index", "shuffle_index")}
    return {"ms": ms, "rss_mb": (rss_kb() - r0) / 1024, "samples": len(train), "index_bytes": idx,
            "documents": int(train.dataset.sequence_lengths.shape[0])}


def get_batch(path: str, rng):
    """nanoGPT's get_batch (karpathy/nanoGPT, train.py, split 'train', device 'cpu'), as written there:
    the memmap made again each batch (its comment: to avoid a memory leak), block_size + 1 tokens read per
    row at a uniform random offset, with replacement and no epoch. torch.randint is given a generator here
    only so the runs are repeatable."""
    import numpy as np
    import torch
    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - SEQ, (BATCH,), generator=rng)
    x = torch.stack([torch.from_numpy((data[i:i + SEQ]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + SEQ]).astype(np.int64)) for i in ix])
    return x, y


def child_nanogpt(prefix: str, seconds: float) -> dict:
    import torch
    rng = torch.Generator().manual_seed(SEED)
    r0, t0 = rss_kb(), time.perf_counter()
    x, y = get_batch(prefix + ".bin", rng)
    out = {"ms": (time.perf_counter() - t0) * 1e3, "rss_mb": (rss_kb() - r0) / 1024}
    if seconds:
        out.update(run_for(lambda: iter(lambda: get_batch(prefix + ".bin", rng), None), seconds,
                           lambda b: b[0].numel()))
    return out


def run_for(make, seconds: float, tokens) -> dict:
    """Batches of make()'s iterator for seconds, and the tokens/s they held."""
    n, t0 = 0, time.perf_counter()
    for b in make():
        n += tokens(b)
        if time.perf_counter() - t0 >= seconds:
            break
    dt = time.perf_counter() - t0
    return {"tokens": n, "seconds": dt, "tokens_per_s": n / dt}


def child_riffle(prefix: str, packing: str, seconds: float) -> dict:
    import riffle.torch as rt
    r0, t0 = rss_kb(), time.perf_counter()
    dl = rt.loader(prefix, BATCH, seq_len=SEQ, packing=packing, seed=SEED)
    it = iter(dl)
    b = next(it)
    out = {"ms": (time.perf_counter() - t0) * 1e3, "rss_mb": (rss_kb() - r0) / 1024}
    assert tuple(b["input_ids"].shape) == (BATCH, SEQ), b["input_ids"].shape
    if seconds:
        out.update(run_for(lambda: it, seconds, lambda b: b["input_ids"].numel()))
    return out


def child_state(prefix: str, other: str) -> dict:
    """The bytes of a riffle.Loader's state_dict as JSON, one batch in: a corpus, and a mixture of two whose
    weights changed at a step."""
    import riffle
    out = {}
    ld = riffle.Loader(prefix, BATCH, seq_len=SEQ, seed=SEED)
    next(iter(ld))
    out["state_bytes"] = len(json.dumps(ld.state_dict()))
    ld.close()
    ld = riffle.Loader(batch_size=BATCH, mixture=[(prefix, 1), (other, 1)], seq_len=SEQ, seed=SEED)
    it = iter(ld)
    next(it)
    out["mixture_state_bytes"] = len(json.dumps(ld.state_dict()))
    ld.set_weights([3, 1])
    next(it)
    next(it)
    st = ld.state_dict()
    out["mixture_changed_state_bytes"] = len(json.dumps(st))
    out["mixture_changed_state"] = st
    ld.close()
    return out


# --- the parent: each loader in a child process, a fresh daemon for each of riffle's ---

def child(args: list[str], daemon: Daemon | None = None) -> dict:
    """Runs this file's --child args; with a daemon, reads its memory while the child holds its first batch."""
    env = daemon.env if daemon else dict(os.environ)
    p = subprocess.Popen([sys.executable, __file__, "--child", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    line = p.stdout.readline()
    if not line:
        p.wait()
        raise SystemExit(f"{args[0]} failed (exit {p.returncode})")
    out = json.loads(line)
    if daemon:
        m = daemon.status()["memory"]
        out["daemon_heap_mb"] = (m["go_heap"] - daemon.m0["go_heap"]) / 2**20
        out["daemon_anon_mb"] = (m["rss_anon"] - daemon.m0["rss_anon"]) / 2**20
    p.stdin.write("done\n")
    p.stdin.close()
    p.wait()
    if p.returncode:
        raise SystemExit(f"{args[0]} failed (exit {p.returncode})")
    return out


def fresh_daemon() -> Daemon:
    d = Daemon(name="riffle-bench-tokens")
    d.m0 = d.status()["memory"]
    return d


def riffle_child(args: list[str]) -> dict:
    d = fresh_daemon()
    try:
        return child(args, d)
    finally:
        d.stop()


def riffle_load(prefix: str) -> dict:
    """riffle load: a whole epoch (concat) in one process, no daemon; its wall time, epoch and peak RSS."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", os.environ.get("RIFFLE_BIN", str(REPO / "bin" / "riffle")),
                        "load", prefix, "--seq-len", str(SEQ), "--batch-size", str(BATCH), "--seed", str(SEED),
                        "--json"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    ep = json.loads(p.stdout)[0]
    assert ep["repeats"] == 0
    return {"wall_s": wall, "epoch_s": ep["seconds"], "tokens_per_s": ep["tokens_per_sec"],
            "peak_rss_mb": int(p.stderr.strip().splitlines()[-1]) / 1024, "samples": ep["samples"]}


def warm(prefix: str) -> None:
    for ext in (".bin", ".idx"):
        with open(prefix + ext, "rb") as f:
            while f.read(16 << 20):
                pass


def summary(name: str, runs: list[dict]) -> None:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out = {"what": name, "runs": len(runs)}
    for k in keys:
        xs = [r[k] for r in runs]
        out[k] = round(statistics.median(xs), 3)
        if len(xs) > 1 and min(xs) != max(xs):
            out[k + "_range"] = [round(min(xs), 3), round(max(xs), 3)]
    print(json.dumps(out), flush=True)


def part_first(prefix: str, repeats: int, cache_root: str) -> dict:
    runs: dict[str, list[dict]] = {}
    for r in range(repeats):
        for name, fn in [
            ("nanogpt get_batch", lambda: child(["nanogpt", prefix, "0"])),
            ("riffle.torch concat", lambda: riffle_child(["riffle", prefix, "concat", "0"])),
            ("riffle.torch best_fit", lambda: riffle_child(["riffle", prefix, "best_fit", "0"])),
            ("megatron GPTDataset build", lambda: child(["megatron", prefix, cache_root + f"/m{r}"])),
            ("megatron GPTDataset cached", lambda: child(["megatron", prefix, cache_root + f"/m{r}"])),
            ("riffle load concat (an epoch, cold start)", lambda: riffle_load(prefix)),
        ]:
            drop_caches()
            l0 = load()
            out = fn()
            out["load"] = max(l0, load())
            runs.setdefault(name, []).append(out)
            print(json.dumps({"run": r, "what": name, **out}), flush=True)
        shutil.rmtree(cache_root + f"/m{r}", ignore_errors=True)
    for k, v in runs.items():
        summary("first batch: " + k, v)
    return runs


def part_speed(prefix: str, repeats: int, seconds: float) -> dict:
    runs: dict[str, list[dict]] = {}
    for r in range(repeats):
        for mode in ("cold", "warm"):
            for name, fn in [
                ("nanogpt get_batch", lambda: child(["nanogpt", prefix, str(seconds)])),
                ("riffle.torch concat", lambda: riffle_child(["riffle", prefix, "concat", str(seconds)])),
            ]:
                if mode == "cold":
                    drop_caches()
                else:
                    warm(prefix)
                l0 = load()
                out = fn()
                out["load"] = max(l0, load())
                runs.setdefault(f"{name} {mode}", []).append(out)
                print(json.dumps({"run": r, "what": f"{name} {mode}", **out}), flush=True)
    for k, v in runs.items():
        summary("tokens/s: " + k, v)
    for mode in ("cold", "warm"):
        ratios = [a["tokens_per_s"] / b["tokens_per_s"]
                  for a, b in zip(runs[f"riffle.torch concat {mode}"], runs[f"nanogpt get_batch {mode}"])]
        print(json.dumps({"what": f"tokens/s riffle.torch / nanoGPT, {mode}", "median": round(statistics.median(ratios), 3),
                          "range": [round(min(ratios), 3), round(max(ratios), 3)]}), flush=True)
    return runs


def part_memory(prefix: str, small: str, repeats: int, cache_root: str, docs: int) -> None:
    sdocs = docs // 10
    for packing in ("concat", "best_fit"):
        per = []
        for r in range(repeats):
            big = riffle_child(["riffle", prefix, packing, "0"])
            little = riffle_child(["riffle", small, packing, "0"])
            per.append({f"{k}_bytes_per_doc": (big[f"daemon_{k}_mb"] - little[f"daemon_{k}_mb"]) * 2**20 / (docs - sdocs)
                        for k in ("heap", "anon")}
                       | {"big_heap_mb": big["daemon_heap_mb"], "big_anon_mb": big["daemon_anon_mb"],
                          "small_heap_mb": little["daemon_heap_mb"], "small_anon_mb": little["daemon_anon_mb"]})
            print(json.dumps({"run": r, "what": f"daemon bytes per document, {packing}", **per[-1]}), flush=True)
        summary(f"daemon bytes per document, {packing} (big, small: the corpora's MB)", per)
    for epochs in (1, 10):
        m = child(["megatron", prefix, cache_root + "/mem", str(epochs)])
        shutil.rmtree(cache_root + "/mem", ignore_errors=True)
        ib = m["index_bytes"]
        print(json.dumps({"what": f"megatron index bytes per document, built for {epochs} epochs",
                          **{k: v / m["documents"] for k, v in ib.items()}, "total": sum(ib.values()) / m["documents"],
                          "total_mb": sum(ib.values()) / 2**20, "build_ms": m["ms"], "rss_mb": m["rss_mb"]}), flush=True)
    d = fresh_daemon()
    try:
        st = child(["state", prefix, small], d)
    finally:
        d.stop()
    print(json.dumps({"what": "state bytes (JSON)", **{k: v for k, v in st.items() if k.endswith("bytes")}}), flush=True)
    print(json.dumps({"what": "a mixture's state after a weight change", "state": st["mixture_changed_state"]}), flush=True)


def make(prefix: str, docs: int, tokens: int) -> None:
    if os.path.exists(prefix + ".idx") and os.path.getsize(prefix + ".bin") == 2 * tokens:
        return
    tokgen = Path(tempfile.gettempdir()) / "riffle-bench-tokgen"
    go = shutil.which("go") or "/usr/local/go/bin/go"
    subprocess.run([go, "build", "-o", str(tokgen), "./bench/tokgen"], cwd=REPO, check=True)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    subprocess.run([str(tokgen), "-prefix", prefix, "-docs", str(docs), "-tokens", str(tokens)], check=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, a = sys.argv[2], sys.argv[3:]
        out = {"nanogpt": lambda: child_nanogpt(a[0], float(a[1])),
               "riffle": lambda: child_riffle(a[0], a[1], float(a[2])),
               "megatron": lambda: child_megatron(a[0], a[1], int(a[2]) if len(a) > 2 else 1),
               "state": lambda: child_state(a[0], a[1])}[kind]()
        print(json.dumps(out), flush=True)
        sys.stdin.readline()  # hold what the loader holds until the parent has read the daemon's memory
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/riffle-tokens", help="where the corpus is made (and deleted unless --keep)")
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--tokens", type=int, default=1_000_000_000)
    ap.add_argument("--parts", default="first,speed,memory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--keep", action="store_true", help="keep the corpus")
    args = ap.parse_args()
    prefix, small = os.path.join(args.dir, "synth"), os.path.join(args.dir, "small")
    made = not os.path.exists(prefix + ".idx")
    make(prefix, args.docs, args.tokens)
    make(small, args.docs // 10, args.tokens // 10)
    print(json.dumps({"corpus": prefix, "documents": args.docs, "tokens": args.tokens, "load": load(),
                      "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                               text=True).stdout.strip()}), flush=True)
    cache_root = os.path.join(args.dir, "megatron-cache")
    try:
        parts = args.parts.split(",")
        if "first" in parts:
            part_first(prefix, args.repeats, cache_root)
        if "speed" in parts:
            part_speed(prefix, args.repeats, args.seconds)
        if "memory" in parts:
            part_memory(prefix, small, args.repeats, cache_root, args.docs)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
        if made and not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
