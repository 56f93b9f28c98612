package pack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// A dataset of rows (Arrow, Hugging Face, Parquet) is packed into
// uncompressed Arrow IPC files, not riffle's record shards: a record shard
// holds one opaque byte string per record, so a row would have to be
// encoded into one (an IPC message of one row costs a schema-sized
// header per row) and the pack would no longer be a dataset of columns.
// An uncompressed IPC file is one riffle reads fastest: every row is the
// byte ranges of its cells, read in place and coalesced with its
// neighbours', with no page to decompress or decode (Rinas's conversion,
// rinas.txt §5, done once for the whole source). The files are what
// riffle's batches already are (the columns as read, dictionaries and
// views resolved, the schema's metadata kept), so a packed dataset reads
// back equal to its source, row by row and column by column.

// rowsBatch is how many rows one record batch of a packed shard holds (one
// loader batch): about batchBytes of them, or an eighth of a shard if
// that is less, so that a shard is cut near its size and a batch of large
// rows (images) is not held whole in memory; and at most maxRowsBatch,
// past which a batch's header is nothing beside its rows anyway.
func rowsBatch(inf dataset.Info, n int, shardBytes int64) int {
	const batchBytes, maxRowsBatch = 4 << 20, 1024
	avg := max(1, inf.Bytes/int64(max(1, n)))
	return int(min(maxRowsBatch, max(1, min(batchBytes, shardBytes/8)/avg)))
}

// writeRows packs rows start... of ds in order, a shard at a time.
func writeRows(ctx context.Context, ds dataset.Rows, d *privdir.Dir, m *dataset.PackManifestFile, start int64, opts Options) error {
	n := ds.Len()
	inf := ds.Info()
	schema, err := outputSchema(inf.Schema)
	if err != nil {
		return fmt.Errorf("pack: %v: the schema: %w", inf.Paths, err)
	}
	schema = withFeatures(schema, inf.Features)
	size := rowsBatch(inf, n, opts.ShardBytes)
	lopts := loader.Options{BatchSize: size, Ordered: true, Batch: int(start) / size, Epochs: 1}
	skip := int(start) % size // rows of the first batch packed already
	l, err := loader.New(ctx, ds, sampler.Sequential{N: n}, lopts)
	if err != nil {
		return err
	}
	defer l.Close()
	out := &rowSink{d: d, m: m, schema: schema, shardBytes: opts.ShardBytes}
	done := int(start)
	for {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			out.abort()
			return err
		}
		rec, free, err := columnar.Record(inf.Schema, b.Data[:b.Columns.Len])
		if err == nil {
			if skip > 0 {
				s := rec.NewSlice(int64(skip), rec.NumRows())
				free()
				rec, free = s, s.Release
			}
			err = out.add(int64(b.IDs[0]+skip), rec)
			done += int(rec.NumRows())
			free()
		}
		b.Release()
		if err != nil {
			out.abort()
			return fmt.Errorf("pack: rows %d...: %w", done, err)
		}
		skip = 0
		if opts.Progress != nil {
			opts.Progress(done, n)
		}
	}
	return out.flush()
}

// outputSchema is the schema of a rows dataset's batches.
func outputSchema(stream []byte) (*arrow.Schema, error) {
	rd, err := ipc.NewReader(bytes.NewReader(stream))
	if err != nil {
		return nil, err
	}
	defer rd.Release()
	return rd.Schema(), nil
}

// withFeatures keeps a Hugging Face dataset's features (which columns are
// Images, a ClassLabel's names) in the schema's metadata, under the key
// datasets writes them under, when the source kept them elsewhere
// (dataset_info.json, a Parquet file's metadata): an Arrow file carries
// them there.
func withFeatures(s *arrow.Schema, features string) *arrow.Schema {
	md := s.Metadata()
	if features == "" || md.FindKey("huggingface") >= 0 {
		return s
	}
	v := `{"info":{"features":` + features + `}}`
	md = arrow.NewMetadata(append(md.Keys(), "huggingface"), append(md.Values(), v))
	return arrow.NewSchema(s.Fields(), &md)
}

// rowSink cuts record batches into IPC files of about shardBytes, naming
// each in the manifest once it is whole.
type rowSink struct {
	d          *privdir.Dir
	m          *dataset.PackManifestFile
	schema     *arrow.Schema
	shardBytes int64
	w          *rowShard
}

// rowShard is one IPC file being written.
type rowShard struct {
	f     *os.File
	name  string
	first int64
	rows  int64
	n     counter
	w     *ipc.FileWriter
}

type counter struct {
	w  io.Writer
	at int64
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.at += int64(n)
	return n, err
}

// add appends rec, whose first row is row first of the source.
func (s *rowSink) add(first int64, rec arrow.RecordBatch) error {
	if s.w == nil {
		name := fmt.Sprintf("shard-%05d%s", len(s.m.Shards), dataset.RowsShardExt)
		// A file already there (a link planted, a second pack into the
		// same directory) fails it.
		f, err := s.d.OpenFile(name+".tmp", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
		if err != nil {
			return err
		}
		w := &rowShard{f: f, name: name, first: first}
		w.n.w = f
		if w.w, err = ipc.NewFileWriter(&w.n, ipc.WithSchema(s.schema)); err != nil {
			f.Close()
			s.d.Remove(name + ".tmp")
			return err
		}
		s.w = w
	}
	if err := s.w.w.Write(rec); err != nil {
		return err
	}
	s.w.rows += rec.NumRows()
	if s.w.n.at >= s.shardBytes {
		return s.flush()
	}
	return nil
}

// flush finishes the open file, if any (its footer written, synced and
// renamed), and names it in the manifest, so that a resumed pack keeps it.
func (s *rowSink) flush() error {
	w := s.w
	if w == nil {
		return nil
	}
	s.w = nil
	err := w.w.Close()
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = s.d.Rename(w.name+".tmp", w.name)
	}
	if err == nil {
		err = s.d.Sync()
	}
	if err != nil {
		s.d.Remove(w.name + ".tmp")
		return err
	}
	s.m.Shards = append(s.m.Shards, dataset.PackShard{Name: w.name, First: w.first, Count: w.rows, Bytes: w.n.at})
	return writeManifest(s.d, s.m)
}

// abort drops the open file.
func (s *rowSink) abort() {
	if w := s.w; w != nil {
		s.w = nil
		w.f.Close()
		s.d.Remove(w.name + ".tmp")
	}
}
