package corpus

import (
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
)

// Docs is a corpus as a dataset of its documents: record d is document
// d's tokens, one byte range of one object. A job keeps an opened corpus
// among its opened datasets through it (shared by the jobs on it, checked
// against its files' versions), and reads its samples' pieces from its
// objects; which tokens form a sample is package sequence's.
type Docs struct{ c *Corpus }

var (
	_ dataset.Dataset = (*Docs)(nil)
	_ dataset.Counted = (*Docs)(nil)
)

// Dataset is c as the dataset of its documents; closing it closes c.
func (c *Corpus) Dataset() *Docs { return &Docs{c: c} }

// Corpus is the corpus.
func (d *Docs) Corpus() *Corpus { return d.c }

// Len is the number of documents.
func (d *Docs) Len() int { return d.c.Docs() }

// Locate is where document doc's tokens lie.
func (d *Docs) Locate(doc int) dataset.Loc {
	l := d.c.Locate(doc, 0, d.c.Len(doc))
	return dataset.Loc{Object: l.Object, Off: l.Off, Len: int(l.Len)}
}

// Label is -1: documents carry none.
func (d *Docs) Label(int) int { return -1 }

// Object is the reader of object i, as Locate and Corpus.Locate name it.
func (d *Docs) Object(i int) storage.Reader { return d.c.Object(i) }

// Objects is the number of objects.
func (d *Docs) Objects() int { return len(d.c.objs) }

// Info describes the corpus as a dataset: its format, the files it was
// opened from with their versions (a Megatron corpus's .idx and .bin),
// its bytes of tokens and their numpy dtype.
func (d *Docs) Info() dataset.Info {
	inf := d.c.inf
	return dataset.Info{Format: inf.Format, Paths: inf.Files, Versions: inf.Versions,
		Bytes: inf.Tokens * int64(inf.Dtype.Size()), Dtype: inf.Dtype.Numpy()}
}

// Close closes the corpus.
func (d *Docs) Close() error { return d.c.Close() }
