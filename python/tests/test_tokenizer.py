"""A real tokenizer's corpus end to end through riffle.torch (issue 48): a byte-level BPE trained here with Hugging
Face ``tokenizers`` on this repository's documentation, its paragraphs written as two Megatron corpora by
megatron-core's own IndexedDatasetBuilder (as preprocess_data.py --append-eod writes them), read with the issue's
call, ``riffle.torch.loader("dir/*.idx", seq_len=..., packing="best_fit", batch_size=...)``, and checked against
plain Python references over the documents megatron-core's IndexedDataset reads back: best_fit's samples are a
best-fit decreasing reference's (every document's tokens once, only documents longer than seq_len split), each
row's labels, position_ids, loss_mask and the batch's cu_seqlens agree with its pieces; concat's rows are the numpy
reference's."""

from __future__ import annotations

import collections
import importlib.util
import os

import numpy as np
import pytest
import torch

import riffle.torch as rt
from conftest import REPO
from test_tokens import concat_reference, document_order

SEED = 17


def _writers():
    """corpus/testdata/writers.py: megatron-core's indexed dataset module, imported without its training stack."""
    spec = importlib.util.spec_from_file_location("riffle_writers", REPO / "corpus" / "testdata" / "writers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bpe_corpus(tmp_path_factory):
    """dir/{a,b}.{bin,idx} of the docs' paragraphs, each ending in EOD; the documents as megatron-core reads them
    back (a's then b's, the glob's order), and the EOD id."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    try:
        idx = _writers().megatron()
    except ImportError as e:
        pytest.skip(f"megatron-core's indexed dataset does not import here: {e}")
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    paragraphs = []
    for p in texts:
        paragraphs += [x.strip() for x in p.read_text(encoding="utf-8").split("\n\n") if x.strip()]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(paragraphs, trainers.BpeTrainer(vocab_size=4000, special_tokens=["<eod>", "[UNK]"]))
    eod = tok.token_to_id("<eod>")
    docs = [e.ids + [eod] for e in tok.encode_batch(paragraphs) if e.ids]
    d = tmp_path_factory.mktemp("bpe")
    half = len(docs) // 2
    read = []
    for name, part in (("a", docs[:half]), ("b", docs[half:])):
        b = idx.IndexedDatasetBuilder(str(d / f"{name}.bin"), dtype=np.uint16)
        for x in part:
            b.add_item(torch.tensor(x))
            b.end_document()
        b.finalize(str(d / f"{name}.idx"))
        ds = idx.IndexedDataset(str(d / name))
        read += [np.asarray(ds[i], dtype=np.int64) for i in range(len(ds))]
    assert [x.tolist() for x in read] == docs
    return str(d), read, eod, tok.get_vocab_size()


def best_fit_reference(docs, seed: int, epoch: int, S: int, window: int) -> list[list[tuple[int, int, int]]]:
    """best_fit's samples of an epoch by its definition (sequence/doc.go), as lists of pieces (document, offset,
    length): the epoch's document order cut into windows; in each, every document cut into pieces of S tokens and
    the rest; the pieces longest first (ties: earlier in the order, then in the document), each into the open bin
    with the least room that holds it (ties: the bin that came to that room last), else a new one; a window's
    samples its bins in the order they opened."""
    order = document_order(len(docs), seed, epoch)
    out = []
    for w in range(0, len(order), window):
        pieces = [(-min(S, len(docs[d]) - off), k, off, d) for k, d in enumerate(order[w:w + window], w)
                  for off in range(0, len(docs[d]), S)]
        bins, clock = [], 0  # each [room, when it came to that room, pieces]
        for neg, _, off, d in sorted(pieces):
            n = -neg
            fits = [b for b in bins if b[0] >= n]
            if fits:
                b = min(fits, key=lambda b: (b[0], -b[1]))
            else:
                b = [S, 0, []]
                bins.append(b)
            clock += 1
            b[0], b[1] = b[0] - n, clock
            b[2].append((d, off, n))
        out += [b[2] for b in bins]
    return out


def arrays_of(docs, pieces, S: int, eod: int) -> dict[str, np.ndarray]:
    """A sample's arrays from its pieces, by their definition: a segment a piece (and after each EOD), padding one
    of its own; a label the next token of the same segment, else -100; loss_mask 1 exactly where a label is."""
    ids = np.zeros(S, np.int64)
    labels = np.full(S, -100, np.int64)
    pos = np.zeros(S, np.int64)
    i = 0
    for d, off, n in pieces:
        t = docs[d][off:off + n]
        ids[i:i + n] = t
        seg = np.concatenate([[0], np.cumsum(t[:-1] == eod)])  # a segment ends after each EOD
        for j in range(n - 1):
            if seg[j + 1] == seg[j]:
                labels[i + j] = t[j + 1]
        starts = np.flatnonzero(np.concatenate([[True], seg[1:] != seg[:-1]]))
        p = np.arange(n) - starts[np.searchsorted(starts, np.arange(n), side="right") - 1]
        pos[i:i + n] = p
        i += n
    pos[i:] = np.arange(S - i)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "loss_mask": (labels != -100).astype(np.float32)}


def batches(dl):
    for b in dl:
        assert set(b) == {"input_ids", "labels", "position_ids", "loss_mask", "cu_seqlens", "max_seqlen"}
        yield {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}


def test_best_fit_of_a_real_tokenizer_against_a_reference(daemon, bpe_corpus):
    root, docs, eod, vocab = bpe_corpus
    S, window = 128, 64
    lengths = np.array([len(x) for x in docs])
    assert lengths.max() > S and np.median(lengths) < S, "lengths that are not realistic for the check"
    ref = best_fit_reference(docs, SEED, 0, S, window)
    # The reference is a partition of every document into pieces, only those longer than S split.
    placed = collections.defaultdict(list)
    for pieces in ref:
        assert sum(n for _, _, n in pieces) <= S
        for d, off, n in pieces:
            placed[d].append((off, n))
    for d, x in enumerate(docs):
        got = sorted(placed[d])
        assert [o for o, _ in got] == list(range(0, len(x), S)) and sum(n for _, n in got) == len(x)
    want = collections.Counter()
    by_row = {}
    for pieces in ref:
        a = arrays_of(docs, pieces, S, eod)
        key = tuple(a["input_ids"].tolist())
        want[key] += 1
        by_row[key] = a
    dl = rt.loader(os.path.join(root, "*.idx"), seq_len=S, packing="best_fit", batch_size=8, pack_window=window,
                   eod=eod, vocab_size=vocab, seed=SEED, num_workers=2)
    got = collections.Counter()
    for b in batches(dl):
        for r, row in enumerate(b["input_ids"]):
            key = tuple(row.tolist())
            got[key] += 1
            assert key in by_row, "a sample that is no reference sample"
            for k in ("labels", "position_ids", "loss_mask"):
                np.testing.assert_array_equal(b[k][r], by_row[key][k], err_msg=k)
        flat = b["position_ids"].reshape(-1)
        cu = np.concatenate([np.flatnonzero(flat == 0), [flat.size]])
        np.testing.assert_array_equal(b["cu_seqlens"], cu)
        assert b["max_seqlen"] == int(np.diff(cu).max())
    assert got == want, f"{sum((want - got).values())} reference samples missing, {sum((got - want).values())} extra"


def test_concat_of_a_real_tokenizer_equals_numpy(daemon, bpe_corpus):
    root, docs, eod, _ = bpe_corpus
    S = 256
    ids, labels, pos = concat_reference(docs, SEED, 0, S)
    want = collections.Counter(tuple(r) for r in ids.tolist())
    by_row = {tuple(r): (lab, p) for r, lab, p in zip(ids.tolist(), labels, pos)}
    dl = rt.loader(os.path.join(root, "*.idx"), seq_len=S, batch_size=8, eod=eod, seed=SEED, num_workers=2)
    got = collections.Counter()
    for b in batches(dl):
        for r, row in enumerate(b["input_ids"]):
            key = tuple(row.tolist())
            got[key] += 1
            lab, p = by_row[key]
            np.testing.assert_array_equal(b["labels"][r], lab)
            np.testing.assert_array_equal(b["position_ids"][r], p)
            np.testing.assert_array_equal(b["loss_mask"][r], (lab != -100).astype(np.float32))
    assert got == want
