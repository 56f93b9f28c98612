package corpus

import (
	"context"
	"fmt"
	"io"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
)

// Flat token files (nanoGPT's train.bin: numpy's tofile of a uint16
// array, no header) and 1-D token .npy arrays (OLMo-core's np.save or
// memmap files). Each file is one document of the corpus, read in file
// order; the documents a reader means are inside, ended by EOD tokens,
// and found in each sample (doc.go says why nothing scans for them).

func openFlat(ctx context.Context, opts Options, format string, names []string) (*Corpus, error) {
	files, err := dataset.ExpandPaths(ctx, opts.Store, names)
	if err != nil {
		return nil, err
	}
	if format == "flat" && opts.Dtype.Size() == 0 {
		return nil, fmt.Errorf("%s: a flat token file says nothing of its dtype: give it (uint16 for nanoGPT's .bin): %w", describe(files), ErrUnsupported)
	}
	c := &Corpus{inf: Info{InBand: true, Dtype: opts.Dtype}}
	for _, name := range files {
		r, err := opts.Store.Open(ctx, name)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.objs = append(c.objs, r)
		c.inf.Paths = append(c.inf.Paths, r.Name())
		c.inf.Versions = append(c.inf.Versions, version(r))
		c.inf.Files = append(c.inf.Files, r.Name())
		start := int64(0)
		d := opts.Dtype
		if format == "npy" {
			if start, d, err = npyTokens(ctx, r); err != nil {
				c.Close()
				return nil, err
			}
			if len(c.big) > 0 && d != c.inf.Dtype {
				c.Close()
				return nil, &FormatError{Path: r.Name(), Err: fmt.Errorf("tokens of %s, the corpus's first file holds %s: %w", d, c.inf.Dtype, ErrCorrupt)}
			}
			c.inf.Dtype = d
		}
		sz := int64(d.Size())
		body := r.Size() - start
		if body%sz != 0 {
			c.Close()
			return nil, &FormatError{Path: r.Name(), Offset: r.Size() - body%sz,
				Err: fmt.Errorf("%d bytes of tokens are no whole number of %s tokens: the file is cut short: %w", body, d, io.ErrUnexpectedEOF)}
		}
		if body == 0 {
			c.Close()
			return nil, &FormatError{Path: r.Name(), Offset: start, Err: fmt.Errorf("no tokens: %w", ErrEmpty)}
		}
		c.runs = append(c.runs, run{doc: len(c.big), obj: len(c.objs) - 1, off: start})
		c.big = append(c.big, body/sz)
	}
	if err := c.finish(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// npyTokens reads a .npy header: where its tokens start and their dtype.
// Only a 1-D array of little-endian integers is a token array.
func npyTokens(ctx context.Context, r storage.Reader) (int64, Dtype, error) {
	n := min(int64(4096), r.Size())
	buf := make([]byte, n)
	if err := r.ReadAt(ctx, buf, 0); err != nil {
		return 0, 0, err
	}
	h, err := dataset.ParseNpyHeader(buf)
	if err == nil && h.DataOffset > int64(len(buf)) {
		if h.DataOffset > r.Size() {
			return 0, 0, &FormatError{Path: r.Name(), Offset: r.Size(), Err: fmt.Errorf(".npy header of %d bytes in a file of %d: %w", h.DataOffset, r.Size(), ErrCorrupt)}
		}
		buf = make([]byte, h.DataOffset)
		if err = r.ReadAt(ctx, buf, 0); err == nil {
			h, err = dataset.ParseNpyHeader(buf)
		}
	}
	if err != nil {
		return 0, 0, &FormatError{Path: r.Name(), Err: err}
	}
	if len(h.Shape) != 1 {
		return 0, 0, &FormatError{Path: r.Name(), Err: fmt.Errorf("an array of shape %v: a token array has one dimension (save arr.reshape(-1)): %w", h.Shape, ErrUnsupported)}
	}
	d, err := ParseDtype(h.Descr)
	if err != nil {
		return 0, 0, &FormatError{Path: r.Name(), Err: fmt.Errorf("%v: %w", err, ErrUnsupported)}
	}
	if want := h.DataOffset + int64(h.Shape[0])*int64(d.Size()); want != r.Size() {
		return 0, 0, &FormatError{Path: r.Name(), Offset: min(want, r.Size()),
			Err: fmt.Errorf("shape %v of %s needs %d bytes, the file has %d: %w", h.Shape, d, want, r.Size(), io.ErrUnexpectedEOF)}
	}
	return h.DataOffset, d, nil
}

// EODLengths reads every token of a flat corpus once and returns the
// lengths of the documents its EOD tokens end (each EOD the last token of
// its document; tokens after a file's last EOD are a document too): the
// lengths WriteIndex needs to make a flat .bin a Megatron corpus, which
// sequence's best_fit and pad can cut.
func EODLengths(ctx context.Context, c *Corpus) ([]int64, error) {
	if !c.inf.HasEOD {
		return nil, fmt.Errorf("%s: no EOD token given to find documents by", describe(c.inf.Paths))
	}
	var lens []int64
	const chunk = 1 << 18
	toks := make([]int64, chunk)
	for doc := range c.Docs() {
		cur := int64(0)
		for off := int64(0); off < c.Len(doc); off += chunk {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			t := toks[:min(chunk, c.Len(doc)-off)]
			if err := c.Read(ctx, doc, off, t); err != nil {
				return nil, err
			}
			for _, v := range t {
				cur++
				if v == c.inf.EOD {
					lens, cur = append(lens, cur), 0
				}
			}
		}
		if cur > 0 {
			lens = append(lens, cur)
		}
	}
	return lens, nil
}
