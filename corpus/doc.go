// Package corpus says what the documents of a tokenized text corpus are:
// N documents, each a run of tokens of one integer dtype lying back to
// back in an object read through storage (a local file or s3://).
//
// A corpus keeps what finding a document's tokens needs and nothing per
// sample: 4 bytes a document (its length) and one checkpoint of the
// running token count every 64 documents (8/64 bytes a document), from
// which a document's start is a checkpoint plus a short sum. Samples, and
// which documents each takes, are package sequence's: a corpus only
// answers "where are tokens off..off+n of document d" (Locate) and reads
// them (Read), checking each token against the vocabulary.
//
// The sources, each one file here:
//
//   - Megatron-LM's .bin/.idx pairs (megatron.go): the index holds every
//     sequence's length and byte pointer, so opening reads the index
//     only. Megatron's GPTDataset treats each sequence as a document
//     (its document indices, which group sequences, are not used to cut
//     samples), and so does riffle.
//   - Flat token files (nanoGPT's uint16 .bin) and 1-D token .npy arrays
//     (OLMo's), in flat.go. Their documents end at end-of-document
//     tokens, which only a scan of every token finds. riffle does not
//     scan: as OLMo-core does, a flat corpus is its files' token stream
//     in file order, and the documents of a sample are found inside it by
//     its EOD tokens (sequence.Fill). A scan's sidecar index would cost a
//     read of the whole corpus before the first step (2 GB for 10^9
//     uint16 tokens: seconds warm, minutes from a disk or an object store)
//     and 8 bytes a document, and the only thing it buys is shuffling
//     documents before cutting, or packing them, which is what the
//     Megatron layout's index already gives: a flat corpus is cut in file
//     order (concat) and refuses best_fit and pad, whose fix is to write
//     a Megatron index for it (WriteIndex reads the stream once and does).
//   - A tokenized column (input_ids: a list of integers per row) of Arrow
//     IPC files, Parquet files or a Hugging Face save_to_disk directory
//     (rows.go): each row a document, found through riffle's Arrow or
//     Parquet index, which knows every row's start in every list, so an
//     uncompressed Arrow list<int> row is one byte range of the file. A
//     Parquet row, or a row of a compressed (LZ4, ZSTD) Arrow record
//     batch, is not: its tokens lie in a block compressed and encoded
//     whole (packed.go). Such a corpus reads a batch of samples' documents
//     as one batch of rows of its dataset, whose blocks are read and
//     unpacked once into the dataset's cache (shared by every batch and
//     job on it), and takes each piece's tokens where its block lies
//     unpacked. Its documents' lengths cost one pass over the column the
//     first time a file is opened (every page read and decoded: 0.3 to
//     0.8 s for 10^7 int32 tokens of zstd Parquet from a cold page cache),
//     kept in the dataset's sidecar index (about 8 bytes a document,
//     trusted as every sidecar is: checked against the file's size and
//     change time), so a later open reads the sidecar only (under a
//     millisecond for that file).
//
// Bad input is an error naming the file and byte offset (a *FormatError
// wrapping ErrCorrupt or ErrUnsupported), at open when the index shows it
// (an index cut short, a pointer past the end of its .bin, an empty
// document, a Parquet page that does not decode) and on read when only
// the tokens do (a token id at or above the vocabulary, a null token of a
// packed corpus; their offset is then their block's, and the error names
// the document and the token in it). A Corpus is safe for concurrent use.
package corpus
