package corpus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
)

// Options says how to open a corpus. The zero value detects the source
// from the names and reads a Megatron, .npy or Arrow corpus; a flat token
// file needs its Dtype.
type Options struct {
	// Format is "megatron", "flat", "npy", "arrow", "hf" or "parquet";
	// empty means tell it from the names (.idx/.bin with its pair, .npy,
	// .arrow, .parquet, a Hugging Face directory; a .bin with no .idx
	// beside it is flat).
	Format string
	// Dtype is a flat file's token type; the other sources say theirs.
	Dtype Dtype
	// EOD is the end-of-document token, when HasEOD: a flat corpus's
	// documents end at it, and sequence.Fill starts a document after it.
	EOD    int64
	HasEOD bool
	// Vocab, if above zero, is the vocabulary's size: a token at or above
	// it is an error when read, naming its file and offset.
	Vocab int64
	// Column is the tokenized column of an Arrow, Parquet or Hugging
	// Face corpus; default "input_ids".
	Column string
	// Split names a split of a Hugging Face DatasetDict directory.
	Split string
	// Store is where the objects are; default the local file system and
	// s3:// names.
	Store storage.Store
	// IndexDir, IndexInDirOnly: where the index of an Arrow or Parquet
	// corpus is kept (dataset.Options).
	IndexDir       string
	IndexInDirOnly bool
}

// Errors a caller can test for with errors.Is. Data errors are a
// *FormatError wrapping one of them.
var (
	ErrCorrupt     = dataset.ErrCorrupt
	ErrUnsupported = dataset.ErrUnsupported
	ErrEmpty       = dataset.ErrEmpty
	// ErrVocab says a token is at or above the vocabulary's size, or
	// negative.
	ErrVocab = errors.New("token id outside the vocabulary")
)

// FormatError is dataset's: bad data at a byte offset of a file.
type FormatError = dataset.FormatError

// Loc is where a run of tokens lies: Len bytes at Off of object Object.
type Loc struct {
	Object int
	Off    int64
	Len    int64
}

// Info describes a corpus.
type Info struct {
	Format string   // "megatron", "flat", "npy", "arrow", "hf", "parquet"
	Paths  []string // the objects read (a Megatron corpus's .bin files)
	Docs   int
	Tokens int64
	Dtype  Dtype
	// InBand says document boundaries are only in the tokens (EOD): the
	// corpus's documents are its files, in order (flat, npy).
	InBand bool
	EOD    int64
	HasEOD bool
	Vocab  int64
	// Multimodal says a Megatron index carried sequence modes (all text).
	Multimodal bool
	// Versions are the store's versions of Files, the objects the corpus
	// was opened from (a Megatron corpus's .idx and .bin, each pair in
	// turn; else Paths): any change to the corpus changes one of them.
	Versions []string
	Files    []string
}

// ckptEvery is how many documents one running-count checkpoint covers: a
// document's start is a checkpoint plus at most ckptEvery-1 lengths.
const ckptEvery = 64

// Corpus is N documents of tokens. Its methods are safe for concurrent use.
type Corpus struct {
	inf  Info
	objs []storage.Reader
	size int
	lens []uint32 // tokens of each document
	big  []int64  // tokens of each document, for documents of 2^32 tokens or more (a flat corpus's files); else nil
	ckpt []int64  // ckpt[k]: tokens before document k*ckptEvery; one more at the end
	runs []run    // sorted by doc
	// closer, if set, closes the objects (the Arrow dataset they are
	// read through).
	closer io.Closer
	// rows, for a packed corpus (packed.go), are its documents as rows of
	// the dataset they are read through; runs is then empty.
	rows dataset.ListRows
}

// run is documents from doc on lying back to back in object obj from
// byte off: a .bin file, a flat file, an Arrow record batch.
type run struct {
	doc int
	obj int
	off int64
}

// Docs is the number of documents.
func (c *Corpus) Docs() int { return c.inf.Docs }

// Len is document doc's number of tokens.
func (c *Corpus) Len(doc int) int64 {
	if c.big != nil {
		return c.big[doc]
	}
	return int64(c.lens[doc])
}

// InBand says the corpus's document boundaries are only its EOD tokens
// (a flat or .npy corpus, whose documents are its files).
func (c *Corpus) InBand() bool { return c.inf.InBand }

// Tokens is the number of tokens of all documents.
func (c *Corpus) Tokens() int64 { return c.inf.Tokens }

// Dtype is the tokens' type.
func (c *Corpus) Dtype() Dtype { return c.inf.Dtype }

// Info describes the corpus.
func (c *Corpus) Info() Info { return c.inf }

// Object returns the reader of object i, as a Loc names it.
func (c *Corpus) Object(i int) storage.Reader { return c.objs[i] }

// Start is the number of tokens before document doc, in corpus order.
func (c *Corpus) Start(doc int) int64 {
	k := doc / ckptEvery
	s := c.ckpt[k]
	for d := k * ckptEvery; d < doc; d++ {
		s += c.Len(d)
	}
	return s
}

// Locate returns where tokens off..off+n of document doc lie. The range
// must be inside the document. Of a packed corpus (Packed), whose tokens
// lie in no byte range, it is where the block holding the document lies
// (a Parquet page group, a compressed record batch), with the document's
// share of its bytes: what an error or inspect names.
func (c *Corpus) Locate(doc int, off, n int64) Loc {
	if c.rows != nil {
		l := c.rows.Locate(doc)
		return Loc{Object: l.Object, Off: l.Off, Len: int64(l.Len)}
	}
	r := c.runs[sort.Search(len(c.runs), func(i int) bool { return c.runs[i].doc > doc })-1]
	first := c.Start(r.doc)
	sz := int64(c.size)
	return Loc{Object: r.obj, Off: r.off + (c.Start(doc)-first+off)*sz, Len: n * sz}
}

// Read reads len(dst) tokens of document doc from token off, checking each
// against the vocabulary.
func (c *Corpus) Read(ctx context.Context, doc int, off int64, dst []int64) error {
	if doc < 0 || doc >= c.Docs() || off < 0 || off+int64(len(dst)) > c.Len(doc) {
		return fmt.Errorf("tokens %d..%d of document %d: outside the corpus (%d documents, this one of %d tokens)", off, off+int64(len(dst)), doc, c.Docs(), c.lenOr0(doc))
	}
	if c.rows != nil {
		return c.readPacked(ctx, doc, off, dst)
	}
	l := c.Locate(doc, off, int64(len(dst)))
	b := make([]byte, l.Len)
	if err := c.objs[l.Object].ReadAt(ctx, b, l.Off); err != nil {
		return err
	}
	return c.Decode(l, b, dst)
}

func (c *Corpus) lenOr0(doc int) int64 {
	if doc < 0 || doc >= c.Docs() {
		return 0
	}
	return c.Len(doc)
}

// Decode turns the bytes read at l into tokens, checking each: a token
// at or above the vocabulary (or negative) is a *FormatError naming the
// object and the token's byte offset. dst holds l.Len/size tokens. A
// packed corpus's tokens are decoded by DocBatch.Tokens instead.
func (c *Corpus) Decode(l Loc, b []byte, dst []int64) error {
	sz := int64(c.size)
	if int64(len(b)) != l.Len || int64(len(dst))*sz != l.Len {
		return fmt.Errorf("decode %d bytes of %s at %d into %d tokens of %d bytes", len(b), c.objs[l.Object].Name(), l.Off, len(dst), sz)
	}
	c.inf.Dtype.decode(dst, b)
	vocab := c.inf.Vocab
	for i, v := range dst {
		if v < 0 || vocab > 0 && v >= vocab {
			return &FormatError{Path: c.objs[l.Object].Name(), Offset: l.Off + int64(i)*sz,
				Err: fmt.Errorf("token %d is outside the vocabulary [0, %d): %w", uint64(v), vocab, ErrVocab)}
		}
	}
	return nil
}

// Close closes the corpus's objects.
func (c *Corpus) Close() error {
	if c.closer != nil {
		c.objs = nil
		return c.closer.Close()
	}
	var errs []error
	for _, o := range c.objs {
		errs = append(errs, o.Close())
	}
	c.objs = nil
	return errors.Join(errs...)
}

// store returns the options' store: dataset's default, the local file
// system and s3:// names.
func (o Options) store() storage.Store {
	if o.Store != nil {
		return o.Store
	}
	l, _ := storage.NewLocal(false, nil)
	return storage.NewRouter(l, storage.S3Options{}, nil)
}

// Open opens the corpus of the given paths: Megatron prefixes, .idx or
// .bin names or globs of them; flat or .npy token files or globs; Arrow
// files or a Hugging Face directory. Several paths make one corpus, the
// documents of each after those of the one before.
func Open(ctx context.Context, opts Options, paths ...string) (*Corpus, error) {
	opts.Store = opts.store()
	if len(paths) == 0 {
		return nil, fmt.Errorf("no path given: %w", ErrEmpty)
	}
	format := opts.Format
	if format == "" {
		var err error
		if format, err = Detect(ctx, opts.Store, paths[0]); err != nil {
			return nil, err
		}
	}
	var c *Corpus
	var err error
	switch format {
	case "megatron":
		c, err = openMegatron(ctx, opts, paths)
	case "flat", "npy":
		c, err = openFlat(ctx, opts, format, paths)
	case "arrow", "hf", "parquet":
		c, err = openRows(ctx, opts, format, paths)
	default:
		return nil, fmt.Errorf("corpus format %q: %w (known: megatron, flat, npy, arrow, hf, parquet)", format, ErrUnsupported)
	}
	if err != nil {
		return nil, err
	}
	c.inf.Format = format
	c.inf.EOD, c.inf.HasEOD, c.inf.Vocab = opts.EOD, opts.HasEOD, opts.Vocab
	return c, nil
}

// Expand resolves names as Open does, once: the format (detected from
// the first name if format is ""), and the names Open then opens without
// a glob matching others: a Megatron corpus's .idx files (a prefix, or a
// glob of prefixes, .idx or .bin names), the files of the others.
func Expand(ctx context.Context, store storage.Store, format string, names []string) (string, []string, error) {
	if store == nil {
		store = Options{}.store()
	}
	if len(names) == 0 {
		return "", nil, fmt.Errorf("no path given: %w", ErrEmpty)
	}
	if format == "" {
		var err error
		if format, err = Detect(ctx, store, names[0]); err != nil {
			return "", nil, err
		}
	}
	if format == "megatron" {
		prefixes, err := megatronPrefixes(ctx, store, names)
		if err != nil {
			return "", nil, err
		}
		out := make([]string, len(prefixes))
		for i, p := range prefixes {
			out[i] = p + ".idx"
		}
		return format, out, nil
	}
	out, err := dataset.ExpandPaths(ctx, store, names)
	return format, out, err
}

// Detect tells a corpus's source from its first name (a nil store is
// the default one): "megatron" for a .idx, a .bin with its .idx beside
// it, or a prefix (or glob of prefixes) of .idx files; "flat" for another
// .bin; "npy", "arrow", "hf" (a directory), "parquet".
func Detect(ctx context.Context, store storage.Store, name string) (string, error) {
	if store == nil {
		store = Options{}.store()
	}
	if st, err := store.Stat(ctx, name); err == nil && st.Dir {
		return "hf", nil
	}
	lower := strings.ToLower(name)
	switch path.Ext(lower) {
	case ".idx":
		return "megatron", nil
	case ".bin":
		// Megatron's .bin has its .idx beside it; nanoGPT's stands alone.
		stem := strings.TrimSuffix(name, path.Ext(name))
		if strings.ContainsAny(stem, "*?[") {
			if m, err := store.Glob(ctx, name); err == nil && len(m) > 0 {
				stem = strings.TrimSuffix(m[0], path.Ext(m[0]))
			}
		}
		if _, err := store.Stat(ctx, stem+".idx"); err == nil {
			return "megatron", nil
		}
		return "flat", nil
	case ".npy":
		return "npy", nil
	case ".arrow", ".feather", ".arrows", ".ipc":
		return "arrow", nil
	case ".parquet", ".pq":
		return "parquet", nil
	case "":
		if _, err := store.Stat(ctx, name+".idx"); err == nil {
			return "megatron", nil // a prefix
		}
		if m, err := store.Glob(ctx, name+".idx"); err == nil && len(m) > 0 {
			return "megatron", nil // a glob of prefixes
		}
	}
	return "", fmt.Errorf("%s: cannot tell the corpus's format (give one: megatron, flat, npy, arrow, hf, parquet): %w", name, fs.ErrNotExist)
}

// finish sets what every source shares once its documents' lengths are
// known: the checkpoints and the totals; an empty document is an error
// naming where it lies.
func (c *Corpus) finish() error {
	n := len(c.lens)
	if c.big != nil {
		n = len(c.big)
	}
	c.inf.Docs = n
	if n == 0 {
		return fmt.Errorf("%s: %w: no documents", describe(c.inf.Paths), ErrEmpty)
	}
	c.ckpt = make([]int64, 0, n/ckptEvery+2)
	total := int64(0)
	for d := range n {
		if d%ckptEvery == 0 {
			c.ckpt = append(c.ckpt, total)
		}
		total += c.Len(d)
	}
	c.ckpt = append(c.ckpt, total)
	c.inf.Tokens = total
	c.size = c.inf.Dtype.Size()
	return nil
}

func describe(paths []string) string {
	if len(paths) == 1 {
		return paths[0]
	}
	if len(paths) == 0 {
		return "corpus"
	}
	return fmt.Sprintf("%s and %d more files", paths[0], len(paths)-1)
}

// version is a Reader's object version, "" if its store cannot say.
func version(r storage.Reader) string { return r.Version() }
