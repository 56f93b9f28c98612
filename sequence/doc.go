// Package sequence says which tokens form each sample of a token corpus:
// a pure function of (the corpus's document lengths, seed, epoch,
// position), with no table of samples. The order of samples across an
// epoch, ranks and workers is not this package's: a caller asks for
// sample i of epoch e, any i in any order, from any goroutine.
//
// Three modes, each defined exactly here and checked in the tests against
// a reference that materializes the epoch (sequence_test.go):
//
// concat (Megatron-LM's GPTDataset, OLMo-core's numpy datasets). The
// epoch's document order is the global shuffle of package sampler
// (sampler.Global, a Feistel permutation keyed by seed and epoch); a
// corpus whose boundaries are in-band (flat token files, corpus.InBand)
// keeps its files in order instead, as OLMo does. The documents are
// concatenated into one stream of T tokens, and sample i is stream tokens
// [i*S, i*S+S+1): S = SeqLen inputs and one more token, which is also the
// first of sample i+1, so that every input has its next token as label.
// An epoch has (T-1)/S samples; the tokens after the last whole sample
// are dropped, or with PadLast make one more sample, padded: ceil((T-1)/S).
// Unlike Megatron, an epoch never reaches into the next one's documents:
// each epoch's samples are exactly its own.
// A sample is found without a table of samples: one pass at the epoch's
// start keeps the running token count at every 64th position of the
// epoch's document order (8/64 bytes a document); sample i's first
// document is then a binary search and a scan of at most 63 documents.
//
// best_fit (Ding et al., "Fewer Truncations Improve Language Modeling",
// ICML 2024, §3: best-fit decreasing). The epoch's document order is cut
// into windows of Window documents. In a window, each document longer
// than S is split into pieces of S tokens and a last piece of the rest;
// the pieces, longest first (ties: earlier in the epoch's order first,
// then earlier in the document), each go into the open bin of S tokens
// with the least room that holds it (ties: the bin that came to that room
// last), or into a new bin. Each bin is a sample, padded to S tokens:
// the window's samples are its bins in the order they were opened, each
// bin's pieces in the order they were placed. No token is dropped; the
// cost is padding and the documents split. One pass at the epoch's start
// packs every window to count its bins (and the padding and split
// rates); a sample is found by a binary search of the windows' counts and
// the window packed again on demand (O(W log S), a few recent windows
// kept). The bins are found with a tree over room sizes, as the paper's
// implementation does with a segment tree.
//
// pad (fine-tuning). Sample i of an epoch is the document at position i
// of the epoch's shuffled order: its first S+1 tokens at most, padded;
// the rest of a longer document is dropped.
//
// Every sample is a list of pieces (document, token offset, length); a
// piece boundary is a document boundary, and a corpus with an EOD token
// has one after each EOD too. Fill makes a sample's training arrays from
// its tokens, one definition for every caller: input_ids, labels,
// position_ids restarting at 0 at each document, cu_seqlens (for
// variable-length attention), and loss_mask.
//
// Labels. labels[i] is the token after input i when it belongs to the
// same document (segment), else Ignore (-100); padding's labels are
// Ignore and its loss_mask 0, and loss_mask is 1 exactly where labels is
// not Ignore. At a boundary this is Hugging Face's
// DataCollatorWithFlattening (-100 where a packed sequence begins: its
// labels are unshifted, ours are the shifted targets, the same pairs) and
// Megatron's eod_mask_loss (which masks an input that is EOD, the last
// token of its document when documents end in EOD); Megatron's default
// instead trains a document's last token to predict the next document's
// first. Padding is a segment of its own in cu_seqlens and
// position_ids (restarting at 0), so variable-length attention never
// mixes it with a document, and cu_seqlens always ends at SeqLen.
package sequence
