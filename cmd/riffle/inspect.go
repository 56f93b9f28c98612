package main

import (
	"context"
	"fmt"
	"math/bits"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/wire"
)

func inspectCmd() *cobra.Command {
	var (
		df    datasetFlags
		tf    tokenFlags
		first int
	)
	cmd := &cobra.Command{
		Use:     "inspect PATH...",
		Short:   "Show a dataset's format, record count, record sizes and first records",
		Example: "  riffle inspect data/train.jsonl\n  riffle inspect images/ --first 3",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tf.wanted(cmd, &df, args) {
				return inspectCorpus(cmd, &tf, &df, args, first)
			}
			ds, err := df.open(cmd.Context(), args)
			if err != nil {
				return err
			}
			defer ds.Close()
			inf := ds.Info()
			rows, isRows := ds.(dataset.Rows)
			files := len(inf.Paths)
			if !isRows {
				// A directory's Paths is its root: count the objects
				// its records live in.
				files = objects(ds)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "format:   %s\nfiles:    %d (%s)\nrecords:  %d\nbytes:    %s\n", inf.Format, files, strings.Join(inf.Paths[:min(3, len(inf.Paths))], ", "), ds.Len(), human(float64(inf.Bytes)))
			if isRows {
				return inspectRows(cmd, rows, first)
			}
			if framed, ok := ds.(dataset.Framed); ok && framed.Checks() {
				n, err := checkFrames(cmd.Context(), ds, framed)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "checked:  every record's frame (%d records: TFRecord length and data CRCs, a pack's CRC32C)\n", n)
			}
			if inf.RecordSize > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "record:   %d bytes", inf.RecordSize)
				if inf.Dtype != "" {
					fmt.Fprintf(cmd.OutOrStdout(), ", dtype %s, shape %v", inf.Dtype, inf.Shape)
				}
				fmt.Fprintln(cmd.OutOrStdout())
			} else {
				// Sizes in power-of-two buckets.
				var hist [64]int
				lo, hi := int(^uint(0)>>1), 0
				for id := range ds.Len() {
					loc := ds.Locate(id)
					n := loc.Len
					if n < 0 {
						return &dataset.FormatError{Path: ds.Object(loc.Object).Name(), Offset: loc.Off, Err: fmt.Errorf("record %d has length %d: %w", id, n, dataset.ErrCorrupt)}
					}
					hist[bits.Len(uint(n))]++
					lo, hi = min(lo, n), max(hi, n)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "sizes:    %d to %d bytes, mean %.1f\n", lo, hi, float64(inf.Bytes)/float64(ds.Len()))
				top := 0
				for _, c := range hist {
					top = max(top, c)
				}
				for b, c := range hist {
					if c == 0 {
						continue
					}
					from := 0
					if b > 0 {
						from = 1 << (b - 1)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "  %8d-%-8d %9d %s\n", from, 1<<b-1, c, strings.Repeat("#", max(1, 40*c/top)))
				}
			}
			if len(inf.Classes) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "classes:  %d (%s)\n", len(inf.Classes), strings.Join(inf.Classes[:min(10, len(inf.Classes))], ", "))
			}
			if inf.Header != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "header:   %s\n", inf.Header)
			}
			framed, _ := ds.(dataset.Framed)
			for id := range min(first, ds.Len()) {
				loc := ds.Locate(id)
				b, err := readRecord(cmd.Context(), ds, framed, id)
				if err != nil {
					return err
				}
				b = b[:min(len(b), 256)]
				label := ""
				if l := ds.Label(id); l >= 0 && l < len(inf.Classes) {
					label = fmt.Sprintf(" label %d (%s)", l, inf.Classes[l])
				} else if l >= 0 {
					label = fmt.Sprintf(" label %d", l)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "record %d: %s offset %d, %d bytes%s\n  %s\n", id, ds.Object(loc.Object).Name(), loc.Off, loc.Len, label, preview(b, loc.Len))
			}
			return nil
		},
	}
	df.register(cmd)
	tf.register(cmd)
	cmd.Flags().IntVar(&first, "first", 5, "how many records to show")
	return cmd
}

// tokenFlags say how to read a token corpus (package corpus), by the
// job options' names (--token-dtype is token_dtype): a Megatron .bin/.idx
// pair is one by its names; a flat token file, a token .npy or a
// tokenized column of Arrow, Parquet or Hugging Face data is one when these flags
// say so. With --seq-len, its samples (package sequence) are cut as
// --packing says.
type tokenFlags struct {
	dtype   string
	eod     int64
	vocab   int64
	column  string
	seqLen  int
	packing string
	padLast bool
	padID   int64
	window  int
}

func (f *tokenFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.dtype, "token-dtype", "", "a flat token file's token type (uint16 for nanoGPT's .bin): read it as a token corpus")
	fl.Int64Var(&f.eod, "eod", -1, "the end-of-document token")
	fl.Int64Var(&f.vocab, "vocab-size", 0, "the vocabulary's size: a token at or above it is an error naming its file and offset")
	fl.StringVar(&f.column, "token-column", "", "read this column of Arrow, Parquet or Hugging Face data (input_ids) as a token corpus")
	fl.IntVar(&f.seqLen, "seq-len", 0, "a sample's inputs: the corpus's records are its samples (docs/tokens.md)")
	fl.StringVar(&f.packing, "packing", "", "how documents become samples: concat (default), best_fit or pad")
	fl.BoolVar(&f.padLast, "pad-last", false, "concat: keep the epoch's last partial sample, padded")
	fl.Int64Var(&f.padID, "pad-id", 0, "the input id of padding")
	fl.IntVar(&f.window, "pack-window", 0, "best_fit: the documents packed together (default 1024)")
}

// spec puts the flags in a job's spec.
func (f *tokenFlags) spec(cmd *cobra.Command, s *wire.JobSpec) {
	s.SeqLen, s.Packing, s.PadLast, s.VocabSize, s.PadID = f.seqLen, f.packing, f.padLast, f.vocab, f.padID
	s.TokenDtype, s.TokenColumn, s.PackWindow = f.dtype, f.column, f.window
	if cmd.Flags().Changed("eod") {
		eod := f.eod
		s.EOD = &eod
	}
}

// wanted says whether args name a token corpus: by the flags, or by a
// Megatron index's name (a .idx, a .bin with its .idx, or a prefix).
func (f *tokenFlags) wanted(cmd *cobra.Command, df *datasetFlags, args []string) bool {
	if f.dtype != "" || f.column != "" || f.seqLen > 0 || cmd.Flags().Changed("eod") || cmd.Flags().Changed("vocab-size") {
		return true
	}
	if df.opts.Format != "" {
		return false
	}
	format, err := corpus.Detect(cmd.Context(), df.opts.Store, args[0])
	return err == nil && format == "megatron"
}

// inspectCorpus shows a token corpus: its documents, tokens, dtype and
// the documents' lengths, and its first documents' first tokens.
func inspectCorpus(cmd *cobra.Command, tf *tokenFlags, df *datasetFlags, args []string, first int) error {
	ctx := cmd.Context()
	opts := corpus.Options{Vocab: tf.vocab, Column: tf.column, Split: df.opts.Split, IndexDir: df.opts.IndexDir, Store: df.opts.Store}
	if tf.eod >= 0 {
		opts.EOD, opts.HasEOD = tf.eod, true
	}
	if tf.dtype != "" {
		d, err := corpus.ParseDtype(tf.dtype)
		if err != nil {
			return err
		}
		opts.Dtype = d
	}
	if tf.column != "" {
		opts.Format = "arrow"
		if st, err := os.Stat(args[0]); err == nil && st.IsDir() {
			opts.Format = "hf"
		}
	}
	c, err := corpus.Open(ctx, opts, args...)
	if err != nil {
		return err
	}
	defer c.Close()
	out := cmd.OutOrStdout()
	inf := c.Info()
	sum := c.Summarize()
	fmt.Fprintf(out, "format:    %s (token corpus)\nfiles:     %d (%s)\n", inf.Format, len(inf.Paths), strings.Join(inf.Paths[:min(3, len(inf.Paths))], ", "))
	docs := "documents: %d"
	switch {
	case inf.InBand:
		docs += " files, whose documents end at EOD tokens (found in each sample, not counted here)"
	case inf.Format == "megatron":
		docs += " (Megatron sequences: each sequence is a document, as GPTDataset takes them)"
	default:
		docs += " (rows)"
	}
	fmt.Fprintf(out, docs+"\n", sum.Docs)
	fmt.Fprintf(out, "tokens:    %d\ndtype:     %s\n", sum.Tokens, sum.Dtype)
	if inf.Multimodal {
		fmt.Fprintln(out, "modes:     a multimodal index, every sequence text (mode 0)")
	}
	if inf.HasEOD {
		fmt.Fprintf(out, "eod:       %d\n", inf.EOD)
	}
	fmt.Fprintf(out, "lengths:   %d to %d tokens, mean %.1f\n", sum.Shortest, sum.Longest, sum.Mean())
	top := 0
	for _, n := range sum.Histogram {
		top = max(top, n)
	}
	for b, n := range sum.Histogram {
		if n == 0 {
			continue
		}
		from := int64(0)
		if b > 0 {
			from = 1 << (b - 1)
		}
		fmt.Fprintf(out, "  %8d-%-8d %9d %s\n", from, int64(1)<<b-1, n, strings.Repeat("#", max(1, 40*n/top)))
	}
	if tf.vocab > 0 {
		if err := checkTokens(ctx, c); err != nil {
			return err
		}
		fmt.Fprintf(out, "checked:   every token below the vocabulary of %d\n", tf.vocab)
	}
	if tf.seqLen > 0 {
		mode := sequence.Mode(tf.packing)
		if mode == "" {
			mode = sequence.Concat
		}
		s, err := sequence.New(c, sequence.Options{SeqLen: tf.seqLen, Mode: mode, PadLast: tf.padLast, Window: tf.window})
		if err != nil {
			return err
		}
		st := s.Stats(0)
		fmt.Fprintf(out, "samples:   %d of seq_len %d (%s, epoch 0 of seed 0): padding %.3f%% of inputs, %.3f%% of documents cut, %.3f%% of tokens dropped\n",
			st.Samples, st.SeqLen, mode, 100*st.PaddingRate(), 100*st.CutRate(), 100*st.DropRate())
	}
	for d := range min(first, c.Docs()) {
		toks := make([]int64, min(c.Len(d), 16))
		if err := c.Read(ctx, d, 0, toks); err != nil {
			return err
		}
		more := ""
		if c.Len(d) > int64(len(toks)) {
			more = " ..."
		}
		l := c.Locate(d, 0, c.Len(d))
		fmt.Fprintf(out, "document %d: %s offset %d, %d tokens\n  %v%s\n", d, c.Object(l.Object).Name(), l.Off, c.Len(d), toks, more)
	}
	return nil
}

// checkTokens reads every token of c, a MiB at a time: one at or above
// the vocabulary is an error naming its file and offset.
func checkTokens(ctx context.Context, c *corpus.Corpus) error {
	buf := make([]int64, 1<<20/c.Dtype().Size())
	for d := range c.Docs() {
		for off := int64(0); off < c.Len(d); off += int64(len(buf)) {
			if err := c.Read(ctx, d, off, buf[:min(int64(len(buf)), c.Len(d)-off)]); err != nil {
				return err
			}
		}
	}
	return nil
}

// readRecord reads record id whole, in its frame if the format has one,
// checking the frame (TFRecord CRCs, unless --skip-crc).
func readRecord(ctx context.Context, ds dataset.Dataset, framed dataset.Framed, id int) ([]byte, error) {
	loc := ds.Locate(id)
	head, tail := 0, 0
	if framed != nil && framed.Checks() {
		head, tail = framed.Frame()
	} else {
		framed = nil
	}
	b := make([]byte, head+loc.Len+tail)
	if err := ds.Object(loc.Object).ReadAt(ctx, b, loc.Off-int64(head)); err != nil {
		return nil, err
	}
	if framed != nil {
		if err := framed.Verify(id, b); err != nil {
			return nil, err
		}
	}
	return b[head : head+loc.Len], nil
}

// objects is the number of objects ds's records live in.
func objects(ds dataset.Dataset) int {
	n := 0
	for id := range ds.Len() {
		n = max(n, ds.Locate(id).Object+1)
	}
	return n
}

// checkFrames reads every record in its frame and verifies it, in reads
// of about a MiB over the records of one object that lie together: a bad
// CRC anywhere in the dataset is an error, not only in the first records.
// It returns the number of records checked.
func checkFrames(ctx context.Context, ds dataset.Dataset, framed dataset.Framed) (int, error) {
	const window = 1 << 20
	head, tail := framed.Frame()
	var buf []byte
	obj, at := -1, int64(0) // buf holds object obj's bytes from at
	for id := range ds.Len() {
		if err := ctx.Err(); err != nil {
			return id, err
		}
		loc := ds.Locate(id)
		from, to := loc.Off-int64(head), loc.Off+int64(loc.Len+tail)
		if loc.Object != obj || from < at || to > at+int64(len(buf)) {
			r := ds.Object(loc.Object)
			n := min(max(to-from, window), r.Size()-from)
			if n < to-from {
				n = to - from // past the end: the read reports it
			}
			buf = slices.Grow(buf[:0], int(n))[:n]
			if err := r.ReadAt(ctx, buf, from); err != nil {
				return id, err
			}
			obj, at = loc.Object, from
		}
		if err := framed.Verify(id, buf[from-at:to-at]); err != nil {
			return id, err
		}
	}
	return ds.Len(), nil
}

// preview shows text as text and anything else as hex.
func preview(b []byte, total int) string {
	more := ""
	if total > len(b) {
		more = "..."
	}
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < 32 && r != '\n' && r != '\t' && r != '\r' }) {
		return fmt.Sprintf("%q%s", b, more)
	}
	if len(b) > 48 {
		b, more = b[:48], "..."
	}
	return fmt.Sprintf("% x%s", b, more)
}

// inspectRows shows a dataset of rows: its columns, features and first
// rows as JSON.
func inspectRows(cmd *cobra.Command, ds dataset.Rows, first int) error {
	out := cmd.OutOrStdout()
	inf := ds.Info()
	fmt.Fprintf(out, "columns:  %d\n", len(inf.Columns))
	for _, c := range inf.Columns {
		null := ""
		if c.Nullable {
			null = ", nullable"
		}
		fmt.Fprintf(out, "  %-20s %s%s\n", c.Name, c.Type, null)
	}
	if inf.Features != "" {
		fmt.Fprintf(out, "features: %s\n", inf.Features)
	}
	ids := make([]int, min(first, ds.Len()))
	for i := range ids {
		ids[i] = i
	}
	if len(ids) == 0 {
		return nil
	}
	msg, _, err := dataset.ReadRows(cmd.Context(), ds, ids)
	if err != nil {
		return err
	}
	rows, err := columnar.JSONRows(inf.Schema, msg)
	if err != nil {
		return err
	}
	for i, r := range rows {
		loc := ds.Locate(i)
		if len(r) > 400 {
			r = r[:400] + "..."
		}
		fmt.Fprintf(out, "record %d: %s offset %d, %d bytes\n  %s\n", i, ds.Object(loc.Object).Name(), loc.Off, loc.Len, r)
	}
	return nil
}
