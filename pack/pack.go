// Package pack rewrites a dataset into riffle's own shards (docs/format.md),
// laid out for the block-aware shuffle: records packed into pages so that
// none straddles a page it need not, a CRC32C and a label per record, cut
// into shards of about ShardBytes. Given a transform, it stores the
// transform's outputs instead, OneAccess's persisted preprocessing
// (oneaccess.txt §3): later jobs read the outputs and skip the work.
//
// Packing is crash-safe: a shard is written under a temporary name,
// synced and renamed, and only then named in the manifest, which is
// itself replaced atomically. A pack killed at any moment leaves no shard
// that looks whole, and packing again resumes after the last whole one.
//
// A pack's directory is its user's alone (internal/privdir): made 0700,
// an existing one of ours narrowed to 0700 and refused if another user
// owns it or anyone else may write it, its files made 0600, and every
// name in it (manifest, shards, temporary files) opened through the
// checked handle without following a symlink. Packing resumes from what
// it finds there, and the daemon serves the outputs in its catalogue, so
// a directory someone else can write would let them plant records.
package pack

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/catalogue"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/transform"
)

// DefaultShardBytes is a shard's size unless told otherwise.
const DefaultShardBytes = 256 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Options says how to pack.
type Options struct {
	// ShardBytes is the size a shard is cut at; default DefaultShardBytes.
	ShardBytes int64
	// Transform, if set, names a transform whose outputs are packed.
	Transform string
	// Progress, if set, is told how many records are packed.
	Progress func(done, total int)
}

// Summary says what a pack wrote.
type Summary struct {
	Records, Shards int
	Bytes           int64 // of records
	Resumed         int   // shards found whole from an earlier run
}

// Pack writes ds into dir, resuming a pack of the same source there.
func Pack(ctx context.Context, ds dataset.Dataset, dir string, opts Options) (Summary, error) {
	rows, _ := ds.(dataset.Rows)
	if rows != nil && opts.Transform != "" {
		return Summary{}, fmt.Errorf("pack: a dataset of rows (%s) is packed as its columns are; --transform persists one output per record, not a row's columns", ds.Info().Format)
	}
	if opts.ShardBytes <= 0 {
		opts.ShardBytes = DefaultShardBytes
	}
	var tf transform.Transform
	canon := ""
	if opts.Transform != "" {
		var err error
		if tf, canon, err = transform.New(opts.Transform); err != nil {
			return Summary{}, err
		}
		if transform.IsRandom(tf) {
			return Summary{}, fmt.Errorf("pack: transform %s draws a new output per job and epoch, so there is "+
				"no one output to persist: pack without it, and name it as the job's transform", canon)
		}
	}
	inf := ds.Info()
	src := dataset.PackSource{Paths: inf.Paths, Versions: inf.Versions, Format: inf.Format, Records: int64(ds.Len()), Bytes: inf.Bytes}
	d, err := openDir(dir)
	if err != nil {
		return Summary{}, err
	}
	defer d.Close()
	m := &dataset.PackManifestFile{Version: 1, Source: src, Transform: canon, ShardBytes: opts.ShardBytes, Records: int64(ds.Len())}
	sum, start, err := resume(d, m)
	if err != nil {
		return sum, err
	}
	if !m.Complete && start < int64(ds.Len()) {
		fill := func() error { return write(ctx, ds, d, m, start, tf, canon, opts) }
		if rows != nil {
			fill = func() error { return writeRows(ctx, rows, d, m, start, opts) }
		}
		if err := fill(); err != nil {
			return sum, err
		}
	}
	return finish(d, m, sum)
}

// openDir opens (or makes) a pack's directory, private to its user.
func openDir(dir string) (*privdir.Dir, error) {
	d, err := privdir.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	return d, nil
}

// resume keeps the whole shards of an earlier pack of the same source in
// d, and returns the first record left to pack.
func resume(d *privdir.Dir, m *dataset.PackManifestFile) (Summary, int64, error) {
	sum := Summary{}
	if old, err := catalogue.ReadManifest(d); err == nil {
		if !sameSource(old, m) {
			return Summary{}, 0, fmt.Errorf("pack: %s holds a pack of another source or transform (%s %v, %q): remove it first", d.Path(), old.Source.Format, old.Source.Paths, old.Transform)
		}
		// Resume after the last shard that is whole: a regular file (not
		// a link to one) of the size the manifest says.
		for _, s := range old.Shards {
			if mode, size, err := d.Lstat(s.Name); err != nil || !mode.IsRegular() || size != s.Bytes {
				break
			}
			m.Shards = append(m.Shards, s)
		}
		sum.Resumed = len(m.Shards)
		if old.Complete && len(m.Shards) == len(old.Shards) {
			m.Complete = true
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return Summary{}, 0, err
	}
	// Whatever a killed run left under temporary names goes.
	if des, err := d.ReadDir(); err == nil {
		for _, de := range des {
			if strings.HasSuffix(de.Name(), ".tmp") {
				d.Remove(de.Name())
			}
		}
	}
	start := int64(0)
	if n := len(m.Shards); n > 0 {
		last := m.Shards[n-1]
		start = last.First + last.Count
	}
	return sum, start, nil
}

// finish marks the pack complete in its manifest.
func finish(d *privdir.Dir, m *dataset.PackManifestFile, sum Summary) (Summary, error) {
	m.Complete = true
	if err := writeManifest(d, m); err != nil {
		return sum, err
	}
	for _, s := range m.Shards {
		sum.Records += int(s.Count)
		sum.Bytes += s.Bytes
	}
	sum.Shards = len(m.Shards)
	return sum, nil
}

func sameSource(a, b *dataset.PackManifestFile) bool {
	return slices.Equal(a.Source.Paths, b.Source.Paths) && slices.Equal(a.Source.Versions, b.Source.Versions) &&
		a.Source.Format == b.Source.Format && a.Source.Records == b.Source.Records && a.Transform == b.Transform && a.ShardBytes == b.ShardBytes
}

// writeManifest replaces the manifest atomically.
func writeManifest(d *privdir.Dir, m *dataset.PackManifestFile) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return d.WriteFileSync(dataset.PackManifest, b)
}

// shardWriter writes one shard.
type shardWriter struct {
	f       *os.File
	name    string
	at      int64
	ents    []dataset.ShardIndexEntry
	labels  bool
	written int64
}

// newShard starts the shard name under a temporary name; a file already
// there (a link planted, a second pack into the same directory) fails it.
func newShard(d *privdir.Dir, name string, h dataset.ShardHeader) (*shardWriter, error) {
	f, err := d.OpenFile(name+".tmp", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
	if err != nil {
		return nil, err
	}
	hb, err := json.Marshal(h)
	if err != nil {
		f.Close()
		return nil, err
	}
	head := make([]byte, 12, 12+len(hb))
	copy(head, dataset.ShardMagic)
	binary.LittleEndian.PutUint32(head[8:], uint32(len(hb)))
	head = append(head, hb...)
	// Records start on a page.
	head = append(head, make([]byte, (dataset.ShardPage-len(head)%dataset.ShardPage)%dataset.ShardPage)...)
	if _, err := f.Write(head); err != nil {
		f.Close()
		return nil, err
	}
	return &shardWriter{f: f, name: name, at: int64(len(head)), labels: h.Labels}, nil
}

// add appends a record, starting it on the next page if it would straddle
// one it fits in.
func (w *shardWriter) add(rec []byte, label int) error {
	page := int64(dataset.ShardPage)
	if n := int64(len(rec)); n > 0 && w.at%page+n > page {
		if pad := (page - w.at%page) % page; pad > 0 && (n <= page || w.at%page != 0) {
			if _, err := w.f.Write(make([]byte, pad)); err != nil {
				return err
			}
			w.at += pad
		}
	}
	if _, err := w.f.Write(rec); err != nil {
		return err
	}
	w.ents = append(w.ents, dataset.ShardIndexEntry{Off: w.at, Len: uint32(len(rec)), CRC: crc32.Checksum(rec, castagnoli), Label: int64(label)})
	w.at += int64(len(rec))
	w.written += int64(len(rec))
	return nil
}

// finish writes the index and footer, syncs and renames the shard.
func (w *shardWriter) finish(d *privdir.Dir) (int64, error) {
	ib := make([]byte, len(w.ents)*dataset.ShardEntry)
	for i, e := range w.ents {
		b := ib[i*dataset.ShardEntry:]
		binary.LittleEndian.PutUint64(b, uint64(e.Off))
		binary.LittleEndian.PutUint32(b[8:], e.Len)
		binary.LittleEndian.PutUint32(b[12:], e.CRC)
		binary.LittleEndian.PutUint64(b[16:], uint64(e.Label))
	}
	foot := make([]byte, dataset.ShardFooter)
	binary.LittleEndian.PutUint64(foot, uint64(w.at))
	binary.LittleEndian.PutUint64(foot[8:], uint64(len(w.ents)))
	binary.LittleEndian.PutUint32(foot[16:], crc32.Checksum(ib, castagnoli))
	copy(foot[24:], dataset.ShardEnd)
	if _, err := w.f.Write(append(ib, foot...)); err != nil {
		w.f.Close()
		return 0, err
	}
	if err := w.f.Sync(); err != nil {
		w.f.Close()
		return 0, err
	}
	if err := w.f.Close(); err != nil {
		return 0, err
	}
	size := w.at + int64(len(ib)+len(foot))
	if err := d.Rename(w.name+".tmp", w.name); err != nil {
		return 0, err
	}
	return size, d.Sync()
}

func (w *shardWriter) abort(d *privdir.Dir) {
	w.f.Close()
	d.Remove(w.name + ".tmp")
}

// write packs records start... in order, a shard at a time, naming each
// in the manifest once it is whole.
func write(ctx context.Context, ds dataset.Dataset, d *privdir.Dir, m *dataset.PackManifestFile, start int64, tf transform.Transform, canon string, opts Options) error {
	n := ds.Len()
	inf := ds.Info()
	h := dataset.ShardHeader{Version: 1, RecordSize: inf.RecordSize, Dtype: inf.Dtype, Shape: inf.Shape, Classes: inf.Classes,
		Labels: ds.Label(0) >= 0, Transform: canon}
	lopts := loader.Options{BatchSize: 256, Ordered: true, Batch: int(start) / 256, Epochs: 1}
	if tf != nil {
		h.RecordSize = tf.Size()
		h.Dtype, h.Shape = tf.Shape()
		lopts.Transform = tf
	}
	skip := int(start) % 256 // records of the first batch packed already
	l, err := loader.New(ctx, ds, sampler.Sequential{N: n}, lopts)
	if err != nil {
		return err
	}
	defer l.Close()
	out := &sink{d: d, m: m, h: h, shardBytes: opts.ShardBytes}
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
		for i, id := range b.IDs {
			if i < skip {
				continue
			}
			label := -1
			if b.Labels != nil {
				label = b.Labels[i]
			}
			if err := out.add(int64(id), b.Record(i), label); err != nil {
				b.Release()
				out.abort()
				return err
			}
			done++
		}
		skip = 0
		b.Release()
		if opts.Progress != nil {
			opts.Progress(done, n)
		}
	}
	return out.flush()
}

// sink cuts records into shards of about shardBytes, naming each in the
// manifest once it is whole.
type sink struct {
	d          *privdir.Dir
	m          *dataset.PackManifestFile
	h          dataset.ShardHeader
	shardBytes int64
	w          *shardWriter
}

// add appends record id; rec is not kept after it returns.
func (s *sink) add(id int64, rec []byte, label int) error {
	if s.w == nil {
		s.h.First = id
		w, err := newShard(s.d, fmt.Sprintf("shard-%05d%s", len(s.m.Shards), dataset.ShardExt), s.h)
		if err != nil {
			return err
		}
		s.w = w
	}
	if err := s.w.add(rec, label); err != nil {
		return err
	}
	if s.w.at >= s.shardBytes {
		return s.flush()
	}
	return nil
}

// flush finishes the open shard, if any, and names it in the manifest, so
// that a resumed pack keeps it.
func (s *sink) flush() error {
	w := s.w
	if w == nil {
		return nil
	}
	s.w = nil
	size, err := w.finish(s.d)
	if err != nil {
		return err
	}
	s.m.Shards = append(s.m.Shards, dataset.PackShard{Name: w.name, First: s.h.First, Count: int64(len(w.ents)), Bytes: size})
	return writeManifest(s.d, s.m)
}

// abort drops the open shard.
func (s *sink) abort() {
	if s.w != nil {
		s.w.abort(s.d)
		s.w = nil
	}
}

// PackTFRecordStreams packs TFRecord files that are read start to end
// (dataset.TFRecordStream: a GZIP or ZLIB file, which has no random access
// and so does not open as a dataset) into dir, as Pack packs a dataset:
// records in file order, shards of about opts.ShardBytes, no labels. A
// pack killed half way resumes: the records of its whole shards are read
// again and skipped. Transforms read records by id and are not taken.
func PackTFRecordStreams(ctx context.Context, dopts dataset.Options, names []string, dir string, opts Options) (Summary, error) {
	if opts.Transform != "" {
		return Summary{}, fmt.Errorf("pack: a transform reads records by id; pack the compressed files first, then pack the result with --transform")
	}
	if opts.ShardBytes <= 0 {
		opts.ShardBytes = DefaultShardBytes
	}
	src := dataset.PackSource{Format: "tfrecord"}
	for _, name := range names {
		st, err := dataset.OpenTFRecordStream(ctx, dopts, name)
		if err != nil {
			return Summary{}, err
		}
		src.Paths, src.Versions = append(src.Paths, st.Path), append(src.Versions, st.Version)
		st.Close()
	}
	d, err := openDir(dir)
	if err != nil {
		return Summary{}, err
	}
	defer d.Close()
	m := &dataset.PackManifestFile{Version: 1, Source: src, ShardBytes: opts.ShardBytes}
	if old, err := catalogue.ReadManifest(d); err == nil && slices.Equal(old.Source.Paths, src.Paths) && slices.Equal(old.Source.Versions, src.Versions) {
		// The count is known only once the streams are read: an earlier
		// pack of the same files knows it.
		m.Source.Records, m.Source.Bytes, m.Records = old.Source.Records, old.Source.Bytes, old.Records
	}
	sum, start, err := resume(d, m)
	if err != nil || m.Complete {
		if err == nil {
			sum, err = finish(d, m, sum)
		}
		return sum, err
	}
	out := &sink{d: d, m: m, h: dataset.ShardHeader{Version: 1}, shardBytes: opts.ShardBytes}
	id, bytes := int64(0), int64(0)
	for _, name := range names {
		st, err := dataset.OpenTFRecordStream(ctx, dopts, name)
		if err != nil {
			out.abort()
			return sum, err
		}
		for {
			if err = ctx.Err(); err != nil {
				break
			}
			var rec []byte
			if rec, err = st.Next(); err != nil {
				break
			}
			if id >= start {
				if err = out.add(id, rec, -1); err != nil {
					break
				}
			}
			id++
			bytes += int64(len(rec))
			if opts.Progress != nil && id%1024 == 0 {
				opts.Progress(int(id), 0)
			}
		}
		st.Close()
		if !errors.Is(err, io.EOF) {
			out.abort()
			return sum, err
		}
	}
	if err := out.flush(); err != nil {
		return sum, err
	}
	if id == 0 {
		return sum, fmt.Errorf("pack: %v: %w", names, dataset.ErrEmpty)
	}
	m.Records, m.Source.Records, m.Source.Bytes = id, id, bytes
	return finish(d, m, sum)
}

// Describe is a one-line account of a pack, for listings.
func Describe(m *dataset.PackManifestFile) string {
	src := strings.Join(m.Source.Paths[:min(2, len(m.Source.Paths))], ", ")
	if len(m.Source.Paths) > 2 {
		src += fmt.Sprintf(" and %d more", len(m.Source.Paths)-2)
	}
	t := m.Transform
	if t == "" {
		t = "(records as they are)"
	}
	return fmt.Sprintf("%s of %s", t, src)
}
