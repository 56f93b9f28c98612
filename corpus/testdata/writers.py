"""Token corpora as other writers make them, for corpus/writers_test.go.

    writers.py write OUT TEXT...   tokenizes TEXT (a BPE trained here with
                                   Hugging Face tokenizers) and writes OUT/
                                   with megatron-core, numpy and datasets,
                                   and OUT/want.json: what their own readers
                                   read back
    writers.py concat PREFIX ORDER.json SEQ_LEN OUT.npy
                                   cuts megatron-core's IndexedDataset in
                                   the given document order with numpy, as
                                   sequence's concat defines samples
"""
import json
import logging
import os
import sys
import types

import numpy as np


def megatron():
    # megatron/core/__init__.py imports its distributed training stack,
    # which needs a newer torch than the tests' 1.13; the indexed dataset
    # module itself does not. Its package parents are made empty here and
    # its one helper from megatron.core.utils (log_single_rank, a logging
    # call) is given; IndexedDatasetBuilder and IndexedDataset are
    # megatron-core's own code, unchanged.
    root = next(p for p in sys.path if os.path.isdir(os.path.join(p, "megatron", "core", "datasets")))
    for name in ("megatron", "megatron.core"):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = m
    u = types.ModuleType("megatron.core.utils")
    u.log_single_rank = lambda logger, level, *a, **k: logger.log(level, *a, **k)
    sys.modules["megatron.core.utils"] = u
    from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def write(out, texts):
    import torch
    import datasets
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    paragraphs = []
    for p in texts:
        with open(p, encoding="utf-8", errors="replace") as f:
            paragraphs += [x.strip() for x in f.read().split("\n\n") if x.strip()]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(paragraphs, trainers.BpeTrainer(vocab_size=3000, special_tokens=["<eod>", "[UNK]"]))
    eod = tok.token_to_id("<eod>")
    docs = [e.ids for e in tok.encode_batch(paragraphs)]
    docs = [d for d in docs if d]
    want = {"eod": eod, "vocab": tok.get_vocab_size(), "megatron": {}}

    idx = megatron()
    # uint16, a document a sequence, each ending in EOD (preprocess_data.py
    # --append-eod).
    b = idx.IndexedDatasetBuilder(os.path.join(out, "mega_u16.bin"), dtype=np.uint16)
    for d in docs:
        b.add_item(torch.tensor(d + [eod]))
        b.end_document()
    b.finalize(os.path.join(out, "mega_u16.idx"))
    # int32, documents of three sequences (sentence splitting).
    b = idx.IndexedDatasetBuilder(os.path.join(out, "mega_i32.bin"), dtype=np.int32)
    for k in range(0, len(docs), 3):
        group = docs[k:k + 3]
        b.add_document(torch.tensor(sum(group, [])), [len(g) for g in group])
    b.finalize(os.path.join(out, "mega_i32.idx"))
    # A multimodal index of text sequences (mode 0) and one of an image
    # (mode 1, as preprocess_mmdata.py writes images).
    for name, modes in (("mega_mm", [0] * 40), ("mega_img", [0] * 39 + [1])):
        b = idx.IndexedDatasetBuilder(os.path.join(out, name + ".bin"), dtype=np.uint16, multimodal=True)
        for d, m in zip(docs, modes):
            b.add_item(torch.tensor(d), mode=m)
        b.end_document()
        b.finalize(os.path.join(out, name + ".idx"))
    for name in ("mega_u16", "mega_i32"):
        ds = idx.IndexedDataset(os.path.join(out, name))
        want["megatron"][name] = [ds[i].tolist() for i in range(len(ds))]
    ds = idx.IndexedDataset(os.path.join(out, "mega_mm"), multimodal=True)
    want["megatron"]["mega_mm"] = [ds[i][0].tolist() for i in range(len(ds))]

    # nanoGPT's prepare.py: every document's ids and EOD, one uint16 array.
    flat = np.array([t for d in docs for t in d + [eod]], dtype=np.uint16)
    flat.tofile(os.path.join(out, "train.bin"))
    want["flat"] = np.fromfile(os.path.join(out, "train.bin"), dtype=np.uint16).tolist()
    # OLMo-core's numpy token files: 1-D arrays, np.save.
    half = len(flat) // 2
    np.save(os.path.join(out, "part-00.npy"), flat[:half].astype(np.uint32))
    np.save(os.path.join(out, "part-01.npy"), flat[half:].astype(np.uint32))
    want["npy"] = [np.load(os.path.join(out, f)).tolist() for f in ("part-00.npy", "part-01.npy")]
    # Hugging Face datasets: a tokenized column, saved to disk.
    datasets.Dataset.from_dict({"input_ids": docs}).save_to_disk(os.path.join(out, "hf"))
    want["hf"] = list(datasets.load_from_disk(os.path.join(out, "hf"))["input_ids"])
    with open(os.path.join(out, "want.json"), "w") as f:
        json.dump(want, f)


def concat(prefix, order_json, seq_len, out):
    ds = megatron().IndexedDataset(prefix)
    with open(order_json) as f:
        order = json.load(f)
    stream = np.concatenate([ds[i] for i in order]).astype(np.int64)
    n = (len(stream) - 1) // seq_len
    np.save(out, np.stack([stream[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)]))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3:])
    else:
        concat(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
