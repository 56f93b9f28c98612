"""Token corpora as other writers make them, for corpus/writers_test.go.

    writers.py write OUT TEXT...   tokenizes TEXT (a BPE trained here with
                                   Hugging Face tokenizers) and writes OUT/
                                   with megatron-core, numpy and datasets,
                                   and OUT/want.json: what their own readers
                                   read back
    writers.py columns OUT TEXT... tokenizes TEXT as write does and writes
                                   the documents as a tokenized column
                                   (input_ids) with pyarrow (Parquet:
                                   snappy, zstd, row groups, dictionary
                                   off and on, every token dtype, a
                                   large_list; Feather: uncompressed, lz4,
                                   zstd) and datasets (to_parquet), and
                                   OUT/columns.json: what pyarrow reads
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


def importable_megatron():
    """Makes megatron-core's datasets package importable on the tests' torch.

    megatron/core/__init__.py imports its distributed training stack,
    which needs a newer torch than the tests' 1.13; the datasets do not.
    Its package parents are made empty here and its one helper from
    megatron.core.utils (log_single_rank, a logging call) is given; the
    datasets' modules are megatron-core's own code, unchanged (bench/tokens.py
    builds GPTDataset through this too)."""
    root = next(p for p in sys.path if os.path.isdir(os.path.join(p, "megatron", "core", "datasets")))
    for name in ("megatron", "megatron.core"):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = m
    u = types.ModuleType("megatron.core.utils")
    u.log_single_rank = lambda logger, level, *a, **k: logger.log(level, *a, **k)
    sys.modules["megatron.core.utils"] = u


def megatron():
    """megatron-core's indexed_dataset module: IndexedDatasetBuilder and IndexedDataset."""
    importable_megatron()
    from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def tokenize(texts):
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
    return docs, eod, tok.get_vocab_size()


def write(out, texts):
    import torch
    import datasets

    docs, eod, vocab = tokenize(texts)
    want = {"eod": eod, "vocab": vocab, "megatron": {}}

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


def columns(out, texts):
    import datasets
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    docs, eod, vocab = tokenize(texts)
    text = [" ".join(map(str, d[:3])) for d in docs]

    def table(typ, with_text=False):
        cols = {"input_ids": pa.array(docs, type=typ)}
        if with_text:
            cols = {"text": pa.array(text), **cols}
        return pa.table(cols)

    n = len(docs)
    i32 = pa.list_(pa.int32())
    path = lambda name: os.path.join(out, name)
    # The reference: uncompressed Arrow, whose rows are byte ranges.
    feather.write_feather(table(i32), path("ref.arrow"), compression="uncompressed", chunksize=n // 3)
    # Parquet as pyarrow writes it: codecs, row groups, small pages (a
    # row group of many), dictionary encoding off and on, data pages v1
    # and v2, every token dtype and a large_list.
    pq.write_table(table(i32, True), path("snappy.parquet"), compression="snappy", row_group_size=n // 3, use_dictionary=False)
    pq.write_table(table(i32), path("zstd_dict.parquet"), compression="zstd", row_group_size=n // 4, use_dictionary=True, data_page_size=4096)
    pq.write_table(table(pa.list_(pa.uint16())), path("u16.parquet"), compression="snappy", row_group_size=n // 2, data_page_size=2048)
    pq.write_table(table(pa.large_list(pa.uint32())), path("u32_large.parquet"), compression="zstd", use_dictionary=False, data_page_version="2.0", data_page_size=8192)
    pq.write_table(table(pa.list_(pa.int64())), path("i64_gzip.parquet"), compression="gzip", row_group_size=n // 5)
    # Uncompressed, with page CRCs: a flipped byte would read as another token but for them.
    pq.write_table(table(i32), path("crc.parquet"), compression="none", use_dictionary=False, data_page_size=4096, write_page_checksum=True)
    # Compressed Feather v2 (Arrow IPC files): lz4 and zstd record batches.
    feather.write_feather(table(i32, True), path("lz4.arrow"), compression="lz4", chunksize=n // 4)
    feather.write_feather(table(pa.large_list(pa.int64())), path("zstd.arrow"), compression="zstd", chunksize=n // 3)
    # Hugging Face datasets' own Parquet export.
    datasets.Dataset.from_dict({"input_ids": docs}).to_parquet(path("hf.parquet"))

    want = {"eod": eod, "vocab": vocab, "files": {}}
    for name in sorted(os.listdir(out)):
        if name.endswith(".parquet"):
            want["files"][name] = pq.read_table(path(name)).column("input_ids").to_pylist()
        elif name.endswith(".arrow"):
            want["files"][name] = feather.read_table(path(name)).column("input_ids").to_pylist()
    with open(path("columns.json"), "w") as f:
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
    elif sys.argv[1] == "columns":
        columns(sys.argv[2], sys.argv[3:])
    else:
        concat(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
