"""bench/tokens.py runs end to end on a tiny corpus and its figures agree
with each other (no timing is checked): riffle load's epoch has Megatron's
samples, Megatron's cached index is the one it built, each loader moved
tokens, a state after a weight change says so, and the corpus it made is
gone after.

    RIFFLE_BIN=$PWD/bin/riffle .venv/bin/python -m pytest -q -p no:cacheprovider bench/test_tokens.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BIN = os.environ.get("RIFFLE_BIN", str(HERE.parent / "bin" / "riffle"))

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="drops the page cache: root"),
    pytest.mark.skipif(not os.path.exists(BIN), reason="no daemon built (make build)"),
]


def test_tokens_bench_runs_and_agrees(tmp_path):
    pytest.importorskip("megatron")
    docs, tokens, seq = 3000, 3_000_000, 2048
    d = tmp_path / "tok"
    p = subprocess.run([sys.executable, str(HERE / "tokens.py"), "--dir", str(d), "--docs", str(docs), "--tokens",
                        str(tokens), "--repeats", "1", "--seconds", "0.2"],
                       capture_output=True, text=True, env=dict(os.environ, RIFFLE_BIN=BIN), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    by = {r["what"]: r for r in rows if "what" in r and "run" not in r}
    want = (tokens - 1) // seq  # concat's samples of an epoch, each seq + 1 tokens sharing the last: Megatron's too

    assert by["first batch: megatron GPTDataset build"]["samples"] == want
    assert by["first batch: megatron GPTDataset cached"]["samples"] == want
    assert by["first batch: riffle load concat (an epoch, cold start)"]["samples"] == want
    for name in ("nanogpt get_batch", "riffle.torch concat", "riffle.torch best_fit"):
        assert by[f"first batch: {name}"]["ms"] > 0
    for name in ("nanogpt get_batch", "riffle.torch concat"):
        for mode in ("cold", "warm"):
            r = by[f"tokens/s: {name} {mode}"]
            assert r["tokens"] > 0 and r["tokens"] % (8 * seq) == 0 and r["tokens_per_s"] > 0
    for mode in ("cold", "warm"):
        assert by[f"tokens/s riffle.torch / nanoGPT, {mode}"]["median"] > 0

    mega = by["megatron index bytes per document, built for 1 epochs"]
    assert mega["document_index"] == 4  # one epoch: an int32 a document
    assert mega["total"] > mega["document_index"]
    st = by["state bytes (JSON)"]
    assert 0 < st["state_bytes"] and 0 < st["mixture_state_bytes"] < st["mixture_changed_state_bytes"]
    changed = by["a mixture's state after a weight change"]["state"]
    assert changed["mixture_weights"][-1][-1] == [3.0, 1.0]

    assert not d.exists(), "the corpus it made was left behind"
