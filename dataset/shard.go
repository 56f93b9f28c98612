package dataset

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"path"
	"sort"
	"strings"

	"github.com/riffle-ml/riffle/storage"
)

// riffle's own shards (docs/format.md), written by riffle pack: records laid
// out in pages so that none straddles a page it need not, an index of
// every record's place, length, CRC32C and label at the end, and a JSON
// header describing the records. A pack is a directory of shards and a
// manifest (riffle-pack.json) naming the shards that are whole; a shard
// not in the manifest (one being written when a pack was killed) is never
// opened.

func init() {
	RegisterFormat(Format{Name: "riffle", Extensions: []string{ShardExt}, OpenPart: openShard,
		OpenDir: openPack, DetectDir: detectPack})
}

const (
	// ShardExt is a shard file's extension.
	ShardExt = ".rshard"
	// RowsShardExt is the extension of a packed dataset of rows' shards:
	// uncompressed Arrow IPC files, which open as the "arrow" format.
	RowsShardExt = ".arrow"
	// ShardMagic starts a shard; ShardEnd ends it.
	ShardMagic = "RFLSHRD1"
	ShardEnd   = "RFLEND01"
	// ShardPage is the page records are laid out in.
	ShardPage = 4096
	// ShardFooter is the footer's size: index offset, count, index CRC,
	// reserved, end magic.
	ShardFooter = 32
	// ShardEntry is an index entry's size: offset, length, CRC, label.
	ShardEntry = 24
	// PackManifest names a pack directory's manifest.
	PackManifest = "riffle-pack.json"
)

// ShardHeader is a shard's JSON header.
type ShardHeader struct {
	Version    int      `json:"version"`
	First      int64    `json:"first"` // the source id of the shard's first record
	RecordSize int      `json:"record_size,omitempty"`
	Dtype      string   `json:"dtype,omitempty"`
	Shape      []int    `json:"shape,omitempty"`
	Classes    []string `json:"classes,omitempty"`
	Transform  string   `json:"transform,omitempty"`
	Labels     bool     `json:"labels,omitempty"`
}

// ShardIndexEntry is one record's entry in a shard's index.
type ShardIndexEntry struct {
	Off   int64
	Len   uint32
	CRC   uint32
	Label int64
}

// PackManifestFile is a pack directory's manifest: the source it was made
// from, and the shards written whole.
type PackManifestFile struct {
	Version    int         `json:"version"`
	Source     PackSource  `json:"source"`
	Transform  string      `json:"transform,omitempty"`
	ShardBytes int64       `json:"shard_bytes"`
	Records    int64       `json:"records"`
	Shards     []PackShard `json:"shards"`
	Complete   bool        `json:"complete"`
}

// PackSource says what a pack was made from: enough to tell a changed
// source from the one packed.
type PackSource struct {
	Paths    []string `json:"paths"`
	Versions []string `json:"versions"`
	Format   string   `json:"format"`
	Records  int64    `json:"records"`
	Bytes    int64    `json:"bytes"`
}

// PackShard is one whole shard of a pack.
type PackShard struct {
	Name  string `json:"name"`
	First int64  `json:"first"`
	Count int64  `json:"count"`
	Bytes int64  `json:"bytes"`
}

// shardPart is one shard: its index, read at open.
type shardPart struct {
	ents  []ShardIndexEntry
	inf   Info
	bytes int64
}

func (p *shardPart) Count() int { return len(p.ents) }
func (p *shardPart) Locate(i int) (int64, int) {
	e := p.ents[i]
	return e.Off, int(e.Len)
}
func (p *shardPart) Bytes() int64      { return p.bytes }
func (p *shardPart) Info() Info        { return p.inf }
func (p *shardPart) label(i int) int   { return int(p.ents[i].Label) }
func (p *shardPart) hasLabels() bool   { return p.inf.labels }
func (p *shardPart) Frame() (int, int) { return 0, 0 }

// Verify checks a record read at off against its CRC in the index.
func (p *shardPart) Verify(rec []byte, name string, off int64) error {
	i := sort.Search(len(p.ents), func(i int) bool { return p.ents[i].Off >= off })
	if i == len(p.ents) || p.ents[i].Off != off {
		return &FormatError{Path: name, Offset: off, Err: fmt.Errorf("no record at this offset in the shard's index: %w", ErrCorrupt)}
	}
	if got := crc32.Checksum(rec, castagnoli); got != p.ents[i].CRC {
		return &FormatError{Path: name, Offset: off, Err: fmt.Errorf("record %d CRC32C %08x, index says %08x: %w", i, got, p.ents[i].CRC, ErrCRC)}
	}
	return nil
}

func openShard(ctx context.Context, f storage.Reader, opts Options) (Part, error) {
	size := f.Size()
	bad := func(off int64, format string, args ...any) error {
		return &FormatError{Path: f.Name(), Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
	}
	if size < 12+ShardFooter {
		return nil, bad(0, "shard of %d bytes, too short", size)
	}
	head := make([]byte, 12)
	if err := f.ReadAt(ctx, head, 0); err != nil {
		return nil, err
	}
	if string(head[:8]) != ShardMagic {
		return nil, bad(0, "not a riffle shard (magic %q)", head[:8])
	}
	hlen := int64(binary.LittleEndian.Uint32(head[8:]))
	if hlen > 1<<24 || 12+hlen > size-ShardFooter {
		return nil, bad(8, "header of %d bytes", hlen)
	}
	hb := make([]byte, hlen)
	if err := f.ReadAt(ctx, hb, 12); err != nil {
		return nil, err
	}
	var h ShardHeader
	if err := json.Unmarshal(hb, &h); err != nil {
		return nil, bad(12, "header: %v", err)
	}
	foot := make([]byte, ShardFooter)
	if err := f.ReadAt(ctx, foot, size-ShardFooter); err != nil {
		return nil, err
	}
	if string(foot[24:]) != ShardEnd {
		return nil, bad(size-8, "no end magic: the shard is cut short")
	}
	idxOff := int64(binary.LittleEndian.Uint64(foot))
	count := int64(binary.LittleEndian.Uint64(foot[8:]))
	if count < 0 || count > (size-ShardFooter)/ShardEntry || idxOff < 0 || idxOff+count*ShardEntry != size-ShardFooter {
		return nil, bad(size-ShardFooter, "footer: index of %d entries at %d", count, idxOff)
	}
	ib := make([]byte, count*ShardEntry)
	if err := f.ReadAt(ctx, ib, idxOff); err != nil {
		return nil, err
	}
	if got, want := crc32.Checksum(ib, castagnoli), binary.LittleEndian.Uint32(foot[16:]); got != want {
		return nil, bad(idxOff, "index CRC32C %08x, footer says %08x", got, want)
	}
	p := &shardPart{ents: make([]ShardIndexEntry, count)}
	end := int64(12 + hlen)
	for i := range p.ents {
		b := ib[i*ShardEntry:]
		e := ShardIndexEntry{Off: int64(binary.LittleEndian.Uint64(b)), Len: binary.LittleEndian.Uint32(b[8:]),
			CRC: binary.LittleEndian.Uint32(b[12:]), Label: int64(binary.LittleEndian.Uint64(b[16:]))}
		if e.Off < end || e.Off+int64(e.Len) > idxOff {
			return nil, bad(idxOff+int64(i)*ShardEntry, "record %d at %d+%d overlaps another or the index", i, e.Off, e.Len)
		}
		// A label names a class (when the shard lists them) or is -1 for
		// none: one past them would index past the names a client shows.
		if h.Labels && (e.Label < -1 || e.Label > math.MaxInt32 || len(h.Classes) > 0 && e.Label >= int64(len(h.Classes))) {
			return nil, bad(idxOff+int64(i)*ShardEntry+16, "record %d's label %d, of %d classes", i, e.Label, len(h.Classes))
		}
		end = e.Off + int64(e.Len)
		p.ents[i] = e
		p.bytes += int64(e.Len)
	}
	p.inf = Info{RecordSize: h.RecordSize, Dtype: h.Dtype, Shape: h.Shape, Classes: h.Classes, Transform: h.Transform, labels: h.Labels}
	return p, nil
}

func detectPack(ctx context.Context, store storage.Store, root string) bool {
	st, err := store.Stat(ctx, path.Join(root, PackManifest))
	return err == nil && !st.Dir
}

// ReadPackManifest reads a pack directory's manifest.
func ReadPackManifest(ctx context.Context, store storage.Store, dir string) (*PackManifestFile, error) {
	p := path.Join(dir, PackManifest)
	b, err := store.ReadFile(ctx, p, 64<<20)
	if err != nil {
		return nil, err
	}
	var m PackManifestFile
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, &FormatError{Path: p, Err: fmt.Errorf("%v: %w", err, ErrCorrupt)}
	}
	return &m, nil
}

// openPack opens a pack directory: the shards its manifest names.
func openPack(ctx context.Context, root string, opts Options) (Dataset, error) {
	m, err := ReadPackManifest(ctx, opts.Store, root)
	if err != nil {
		return nil, err
	}
	if !m.Complete {
		return nil, fmt.Errorf("%s: the pack is not finished (%d shards written): run riffle pack again to finish it", root, len(m.Shards))
	}
	// A pack of rows is Arrow IPC files, every shard of it.
	ext := ShardExt
	if len(m.Shards) > 0 && strings.HasSuffix(m.Shards[0].Name, RowsShardExt) {
		ext = RowsShardExt
	}
	var names []string
	var at int64
	for _, s := range m.Shards {
		if strings.ContainsAny(s.Name, "/\\") || !strings.HasSuffix(s.Name, ext) || s.First != at {
			return nil, &FormatError{Path: path.Join(root, PackManifest), Err: fmt.Errorf("shard %q out of place: %w", s.Name, ErrCorrupt)}
		}
		at += s.Count
		names = append(names, path.Join(root, s.Name))
	}
	var ds Dataset
	if ext == RowsShardExt {
		a, err := openArrow(ctx, names, opts)
		if err != nil {
			return nil, err
		}
		ds = a.dataset()
	} else {
		f, _ := lookupFormat("riffle")
		if ds, err = openFiles(ctx, names, f, opts); err != nil {
			return nil, err
		}
	}
	if int64(ds.Len()) != m.Records {
		ds.Close()
		return nil, &FormatError{Path: path.Join(root, PackManifest), Err: fmt.Errorf("shards hold %d records, the manifest %d: %w", ds.Len(), m.Records, ErrCorrupt)}
	}
	return ds, nil
}
