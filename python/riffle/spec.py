"""The job options, generated from Go's job.Options by `go generate ./job`: do not edit.

Each option's spec name, Python keyword, kind, bounds, default and meaning.
The daemon checks every option and fills every default (job.Check); a
client sends only what its user gave and never works a default out.
"""

from __future__ import annotations

DEFAULT_BATCH_SIZE = 256

# name: (python keyword, kind, min, max, default, doc)
OPTIONS: dict[str, tuple[str, str, int | None, int | None, str, str]] = {
    "paths": ("paths", "strings", None, None, "(required, or mixture)", "files, globs, directories or s3:// URLs making one dataset"),
    "mixture": ("mixture", "mixture", None, None, "none", "instead of paths: sources mixed by weight, [(paths, weight), ...]; each batch's records come from them in proportion, each source in its own order (global, block, sequential, buffered or reservoir)"),
    "mixture_stop": ("mixture_stop", "string", None, None, "first_exhausted", "a mixture's epoch ends when the first source's epoch is used up (first_exhausted) or every source's is, the sooner ones going on into their next epochs (all_exhausted)"),
    "mixture_history": ("mixture_history", "weights", None, None, "none", "a mixture's weights before its current ones, [{until: epoch, position: p, weights: [...]}, ...], each until position p (default 0) of the epoch's order over every rank: where each source had got when they changed"),
    "mixture_schedule": ("mixture_schedule", "schedule", None, None, "none", "weights a mixture changes to after its current ones, [{epoch: e, step: s, weights: [...]}, ...], each from global step s of epoch e (position s x batch_size x world of its order); all_exhausted's at an epoch's start (step 0) only"),
    "format": ("format", "string", None, None, "by extension or content", "the dataset's format: arrow, dir, fixed, hf, libsvm, jsonl, csv, text, npy, parquet, riffle, tar, tfrecord"),
    "record_size": ("record_size", "int", 0, 1073741824, "0 (from the format)", "bytes per record of a fixed-size file"),
    "header_bytes": ("header_bytes", "int", 0, 1099511627776, "0", "bytes before the first fixed-size record"),
    "csv_header": ("csv_header", "bool", None, None, "false", "a CSV's first line is its header"),
    "skip_crc": ("skip_crc", "bool", None, None, "false", "skip TFRecord data CRCs on read"),
    "drop_partial": ("drop_partial", "bool", None, None, "false", "drop a fixed-size file's partial last record instead of refusing the file"),
    "direct": ("direct", "bool", None, None, "true for a shuffle (global or auto) of local files, or of a subset of their records (not a mixture), whose reads the page cache, keeping half the memory (riffle serve --page-cache), would answer under 1 in 8 of; else false", "read with O_DIRECT, past the page cache"),
    "columns": ("columns", "strings", None, None, "every column", "the columns of a rows dataset (Arrow, Parquet, Hugging Face) to read"),
    "split": ("split", "string", None, None, "the only one", "the split of a Hugging Face DatasetDict"),
    "extensions": ("extensions", "strings", None, None, "every file (riffle.torch with decode=\"image\": torchvision's IMG_EXTENSIONS)", "the only file endings a directory dataset takes as records, as ImageFolder's extensions"),
    "subset": ("subset", "subset", None, None, "every record", "part of the dataset: ranges, ids and labels (a range, a list of ids, or a dict in Python)"),
    "filter": ("filter", "filter", None, None, "none", "keep the records (of the subset) whose label is one of labels, whose bytes are within min_size..max_size, whose file matches glob, whose column's value is in in or within min..max"),
    "dedup": ("dedup", "bool", None, None, "false", "records of equal bytes count once (the first by id), by a hash of each record kept beside the index"),
    "refresh": ("refresh", "string", None, None, "none (the files as first opened)", "epoch: a glob or directory dataset grows at each epoch's start by the files found since, after the old ones, whose ids stay"),
    "generations": ("generations", "int", 0, 1099511627776, "0 (as the node's log of the files says)", "with refresh: the generations of files the epoch read, from a state"),
    "transform": ("transform", "string", None, None, "none", "a transform the daemon runs on each record, once for every job naming it (image:size=256,crop=224; random_resized_crop:size=224; libsvm_dense:n_features=N); on rows, on one column (column=NAME, by default the only Image or binary column)"),
    "seq_len": ("seq_len", "int", 0, 1048576, "0 (records: not a token corpus)", "inputs of a sample: the paths are a token corpus (Megatron .idx/.bin, flat token files, a 1-D token .npy, a tokenized column of Arrow, Parquet or a Hugging Face dataset) whose records are each epoch's samples, arrays of this many tokens (docs/tokens.md)"),
    "packing": ("packing", "string", None, None, "concat", "with seq_len, how documents become samples: concat (concatenated in the epoch's document order and cut, each sample sharing its last token with the next), best_fit (packed by best-fit decreasing over windows of documents, padded; one epoch a job), pad (one document a sample, truncated or padded)"),
    "pad_last": ("pad_last", "bool", None, None, "false", "with packing concat: keep the epoch's last partial sample, padded, instead of dropping it"),
    "eod": ("eod", "int", 0, 1099511627775, "none", "with seq_len, the end-of-document token: a flat corpus's documents end at it, and in every corpus a document's segment ends after it"),
    "vocab_size": ("vocab_size", "int", 0, 1099511627776, "0 (not checked)", "with seq_len, the vocabulary's size: a token at or above it is an error naming its file and offset"),
    "pad_id": ("pad_id", "int", 0, 1099511627775, "0", "with seq_len, the input id of padding (its labels are -100 and its loss_mask 0)"),
    "token_dtype": ("token_dtype", "string", None, None, "the files' (a flat file says none: required)", "with seq_len, a flat token file's dtype: uint8, int8, int16, uint16, int32, uint32, int64 or uint64 (nanoGPT's .bin: uint16)"),
    "token_column": ("token_column", "string", None, None, "input_ids", "with seq_len, the column of an Arrow, Parquet or Hugging Face corpus holding each row's list of token ids"),
    "pack_window": ("pack_window", "int", 0, 1048576, "1024", "with packing best_fit, the documents of the epoch's order packed together"),
    "shuffle": ("shuffle", "bool", None, None, "true in clients (false: sequential)", "a global shuffle each epoch"),
    "sampler": ("sampler", "string", None, None, "global (Parquet: block over pages)", "the order: global, sequential, block, buffered, reservoir; or auto: the global or block order (block_size, window) of least device time per epoch, on the device's measured rate by read size, whose randomization level reaches min_randomness (opened says which)"),
    "min_randomness": ("min_randomness", "float", None, None, "0.9", "with sampler auto: the least randomization level (DeepIO's RL, 0 to 1; a global shuffle is 1) of the order it picks"),
    "auto_order": ("auto_order", "order", None, None, "none (choose)", "with sampler auto: the order it chose before ({sampler, block_size, window}, from opened or a state), read again without choosing"),
    "block_size": ("block_size", "int", 0, 1073741824, "the device's block", "bytes per block of the block and buffered orders"),
    "window": ("window", "int", 0, 256, "16 (pages: 16)", "blocks whose records the block order spreads over as many batches"),
    "buffer": ("buffer", "int", 0, 67108864, "the sampler's", "records in each window the buffered order shuffles (its memory)"),
    "reservoir": ("reservoir", "int", 0, 67108864, "the sampler's", "records of the reservoir order's reservoir"),
    "opportunistic": ("opportunistic", "int", 0, 256, "1 (off)", "batches of whichever records of that many batches arrive first"),
    "seed": ("seed", "int", 0, 9223372036854775807, "0 (riffle.torch: drawn from torch's generator)", "the order's seed: epochs are functions of (seed, epoch)"),
    "rank": ("rank", "int", 0, 65535, "0", "this rank, as DistributedSampler's"),
    "world": ("world_size", "int", 0, 65536, "1", "ranks sharing each epoch"),
    "rank_drop_last": ("rank_drop_last", "bool", None, None, "false", "DistributedSampler's drop_last: ranks drop the tail instead of padding"),
    "share": ("share", "bool", None, None, "false", "sample dependently with the other sharing jobs on this source: reads, transforms and the cache shared (a global shuffle's: another order reads alone)"),
    "batch_size": ("batch_size", "int", 1, 1048576, "256", "records per batch"),
    "drop_last": ("drop_last", "bool", None, None, "false", "DataLoader's drop_last: drop the last short batch"),
    "prefetch": ("prefetch", "int", 0, 1024, "adaptive (sharing: 2)", "batches read ahead"),
    "depth": ("depth", "int", 0, 4096, "chosen per device from its rate and latency as it reads", "reads in flight; set, it pins them (the job then reads through its own queue)"),
    "memory_bytes": ("memory", "int", 0, 9223372036854775807, "room for 16 batches, at least 64 MiB (in a small memory budget, a 32nd of its part for jobs)", "the bound on batches in flight and held"),
    "ordered": ("ordered", "bool", None, None, "false when shuffling", "keep the sampler's order inside batches"),
    "batch_stride": ("batch_stride", "int", 0, 65536, "1", "deliver only batches offset, offset+stride, ... (DataLoader workers)"),
    "batch_offset": ("batch_offset", "int", 0, 65535, "0", "see batch_stride"),
    "epoch": ("epoch", "int", 0, 1099511627776, "0", "the epoch to start at"),
    "start": ("start", "int", 0, 1099511627776, "0", "positions of epoch's order delivered by another topology: the job is the rest of that epoch (one epoch of an order that is a function of position: not shared)"),
    "batch": ("batch", "int", 0, 1099511627776, "0", "the batch to start at"),
    "epochs": ("epochs", "int", -1, 1073741824, "1 (negative: without end)", "epochs to load"),
    "sampler_state": ("sampler_state", "bytes", None, None, "none", "a stream order's saved state (from a batch's state)"),
    "skip": ("skip", "ids", None, None, "none", "records of the opportunistic window already delivered"),
    "delivered": ("delivered", "states", None, None, "none", "the places in epoch of every part (rank, worker) of a shared or opportunistic order's run, of any topology: the job is the rest of that epoch without the records they delivered (one epoch)"),
}

# Python keyword -> spec name.
BY_KEYWORD = {v[0]: k for k, v in OPTIONS.items()}

# The parts of a job the options decide: group: (what it decides, its options' Python keywords).
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "dataset": (
        "what the records are: the files, their format, which of them are read, a transform of each",
        ("paths", "mixture", "mixture_stop", "mixture_schedule", "format", "record_size", "header_bytes", "csv_header",
         "skip_crc", "drop_partial", "direct", "columns", "split", "extensions", "subset", "filter", "dedup",
         "refresh", "transform", "seq_len", "packing", "pad_last", "eod", "vocab_size", "pad_id", "token_dtype",
         "token_column", "pack_window")),
    "order": (
        "which records in which order each epoch",
        ("shuffle", "sampler", "min_randomness", "block_size", "window", "buffer", "reservoir", "opportunistic",
         "seed")),
    "sharing": (
        "how an epoch is split over ranks and DataLoader workers, and shared with other jobs",
        ("rank", "world_size", "rank_drop_last", "share", "batch_stride", "batch_offset")),
    "batches": (
        "how batches are made and loaded: their size, what is read ahead, their memory",
        ("batch_size", "drop_last", "prefetch", "depth", "memory", "ordered")),
    "place": (
        "where in the epochs a job starts, and what it carries on from: a client sets them from a state",
        ("mixture_history", "generations", "auto_order", "epoch", "start", "batch", "epochs", "sampler_state", "skip",
         "delivered")),
}

# The sampler kinds, from Go's one table of them (sampler.Kinds), the first the default; sampler "auto" picks
# the global or the block order. What a job's order is, and how its places resume, its opened reply says
# (Loader.order): a client never works it out from these.
# name: (positional, packed, uniform, windows)
SAMPLERS: dict[str, tuple[bool, bool, bool, bool]] = {
    "global": (True, True, True, False),
    "sequential": (True, True, False, False),
    "block": (True, True, False, True),
    "buffered": (True, False, False, False),
    "reservoir": (True, False, False, False),
}
