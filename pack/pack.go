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
	"path/filepath"
	"slices"
	"strings"

	"github.com/riffle-ml/riffle/dataset"
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
	if _, ok := ds.(dataset.Rows); ok {
		return Summary{}, fmt.Errorf("pack: %s data is read in place, row by row (riffle convert rewrites a compressed Arrow file)", ds.Info().Format)
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
	}
	inf := ds.Info()
	src := dataset.PackSource{Paths: inf.Paths, Versions: inf.Versions, Format: inf.Format, Records: int64(ds.Len()), Bytes: inf.Bytes}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Summary{}, err
	}
	m := &dataset.PackManifestFile{Version: 1, Source: src, Transform: canon, ShardBytes: opts.ShardBytes, Records: int64(ds.Len())}
	sum := Summary{}
	if old, err := readManifest(dir); err == nil {
		if !sameSource(old, m) {
			return Summary{}, fmt.Errorf("pack: %s holds a pack of another source or transform (%s %v, %q): remove it first", dir, old.Source.Format, old.Source.Paths, old.Transform)
		}
		// Resume after the last shard that is whole.
		for _, s := range old.Shards {
			if st, err := os.Stat(filepath.Join(dir, s.Name)); err != nil || st.Size() != s.Bytes {
				break
			}
			m.Shards = append(m.Shards, s)
		}
		sum.Resumed = len(m.Shards)
		if old.Complete && len(m.Shards) == len(old.Shards) {
			m.Complete = true
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return Summary{}, err
	}
	// Whatever a killed run left under temporary names goes.
	if tmps, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(tmps) > 0 {
		for _, t := range tmps {
			os.Remove(t)
		}
	}
	start := int64(0)
	if n := len(m.Shards); n > 0 {
		last := m.Shards[n-1]
		start = last.First + last.Count
	}
	if !m.Complete && start < int64(ds.Len()) {
		if err := write(ctx, ds, dir, m, start, tf, canon, opts); err != nil {
			return sum, err
		}
	}
	m.Complete = true
	if err := writeManifest(dir, m); err != nil {
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

func readManifest(dir string) (*dataset.PackManifestFile, error) {
	b, err := os.ReadFile(filepath.Join(dir, dataset.PackManifest))
	if err != nil {
		return nil, err
	}
	var m dataset.PackManifestFile
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("pack: %s: %w", filepath.Join(dir, dataset.PackManifest), err)
	}
	return &m, nil
}

// writeManifest replaces the manifest atomically.
func writeManifest(dir string, m *dataset.PackManifestFile) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, dataset.PackManifest), b)
}

// writeAtomic writes a file under a temporary name, syncs it, renames it
// into place and syncs the directory.
func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
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

func newShard(dir, name string, h dataset.ShardHeader) (*shardWriter, error) {
	f, err := os.Create(filepath.Join(dir, name+".tmp"))
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
func (w *shardWriter) finish(dir string) (int64, error) {
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
	if err := os.Rename(filepath.Join(dir, w.name+".tmp"), filepath.Join(dir, w.name)); err != nil {
		return 0, err
	}
	return size, syncDir(dir)
}

func (w *shardWriter) abort(dir string) {
	w.f.Close()
	os.Remove(filepath.Join(dir, w.name+".tmp"))
}

// write packs records start... in order, a shard at a time, naming each
// in the manifest once it is whole.
func write(ctx context.Context, ds dataset.Dataset, dir string, m *dataset.PackManifestFile, start int64, tf transform.Transform, canon string, opts Options) error {
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
	var w *shardWriter
	done := int(start)
	flush := func() error {
		if w == nil {
			return nil
		}
		size, err := w.finish(dir)
		if err != nil {
			return err
		}
		m.Shards = append(m.Shards, dataset.PackShard{Name: w.name, First: h.First, Count: int64(len(w.ents)), Bytes: size})
		w = nil
		// The shard is whole: name it, so a resumed pack keeps it.
		return writeManifest(dir, m)
	}
	for {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if w != nil {
				w.abort(dir)
			}
			return err
		}
		for i, id := range b.IDs {
			if i < skip {
				continue
			}
			if w == nil {
				h.First = int64(id)
				if w, err = newShard(dir, fmt.Sprintf("shard-%05d%s", len(m.Shards), dataset.ShardExt), h); err != nil {
					b.Release()
					return err
				}
			}
			label := -1
			if b.Labels != nil {
				label = b.Labels[i]
			}
			if err := w.add(b.Record(i), label); err != nil {
				b.Release()
				w.abort(dir)
				return err
			}
			done++
			if w.at >= opts.ShardBytes {
				if err := flush(); err != nil {
					b.Release()
					return err
				}
			}
		}
		skip = 0
		b.Release()
		if opts.Progress != nil {
			opts.Progress(done, n)
		}
	}
	return flush()
}

// Stale reports whether a pack's source has changed since it was packed:
// its files' versions (device, inode, mtime, size) differ.
func Stale(m *dataset.PackManifestFile, versions []string) bool {
	return !slices.Equal(m.Source.Versions, versions)
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
