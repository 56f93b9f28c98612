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
//     IPC files or a Hugging Face save_to_disk directory (rows.go): each
//     row a document, found through riffle's Arrow index, which knows
//     every row's start in every variable-length buffer, so an
//     uncompressed list<int> row is one byte range of the file.
//
// Bad input is an error naming the file and byte offset (a *FormatError
// wrapping ErrCorrupt or ErrUnsupported), at open when the index shows it
// (an index cut short, a pointer past the end of its .bin, an empty
// document) and on read when only the tokens do (a token id at or above
// the vocabulary). A Corpus is safe for concurrent use.
package corpus
