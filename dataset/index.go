package dataset

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"

	"github.com/riffle-ml/riffle/storage"
)

// The sidecar index of a variable-length file is its offset table: one
// little-endian uint64 per record plus one for the end, 8 bytes per record,
// behind a header that ties it to the source's size and version (its
// store's ObjectInfo.Version: device, inode and mtime of a local file, the
// ETag of an object) and a trailing CRC32C. Records whose end is not where
// the next begins (a line followed by blank lines, a last line without
// its newline) are listed after the offsets with their ends; most files
// have none. It sits next to the data as NAME.ridx, or in the cache
// directory when the data's directory is read-only.
//
//	0  magic "RFLIDX01"
//	8  version uint32
//	12 variant uint32 (format and options that change the offsets)
//	16 source size uint64
//	24 source version hash uint64 (FNV-1a of the version string)
//	32 count uint64
//	40 exceptions uint64
//	48 offsets [count+1]uint64
//	.. exceptions [exceptions](record uint64, end uint64), by record
//	.. crc32c uint32 of all bytes before it
const (
	indexMagic   = "RFLIDX01"
	indexVersion = 2
	indexHeader  = 48
	// IndexExt is the sidecar file's extension.
	IndexExt = ".ridx"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type indexKey struct {
	variant uint32
	size    int64
	version uint64
}

// table is an offset table: record i spans offs[i] to offs[i+1] less the
// format's tail, unless ends lists another end for it.
type table struct {
	offs []int64
	ends []recordEnd // sorted by record
}

type recordEnd struct {
	record int
	end    int64
}

// end returns record i's end if it is an exception.
func (t *table) end(i int) (int64, bool) {
	if len(t.ends) == 0 {
		return 0, false
	}
	k := sort.Search(len(t.ends), func(k int) bool { return t.ends[k].record >= i })
	if k < len(t.ends) && t.ends[k].record == i {
		return t.ends[k].end, true
	}
	return 0, false
}

func sourceKey(r storage.Reader, variant uint32) indexKey {
	h := fnv.New64a()
	h.Write([]byte(version(r)))
	return indexKey{variant: variant, size: r.Size(), version: h.Sum64()}
}

func encodeIndex(k indexKey, t table) []byte {
	b := make([]byte, indexHeader+8*len(t.offs)+16*len(t.ends)+4)
	copy(b, indexMagic)
	binary.LittleEndian.PutUint32(b[8:], indexVersion)
	binary.LittleEndian.PutUint32(b[12:], k.variant)
	binary.LittleEndian.PutUint64(b[16:], uint64(k.size))
	binary.LittleEndian.PutUint64(b[24:], k.version)
	binary.LittleEndian.PutUint64(b[32:], uint64(len(t.offs)-1))
	binary.LittleEndian.PutUint64(b[40:], uint64(len(t.ends)))
	at := indexHeader
	for _, o := range t.offs {
		binary.LittleEndian.PutUint64(b[at:], uint64(o))
		at += 8
	}
	for _, e := range t.ends {
		binary.LittleEndian.PutUint64(b[at:], uint64(e.record))
		binary.LittleEndian.PutUint64(b[at+8:], uint64(e.end))
		at += 16
	}
	n := len(b) - 4
	binary.LittleEndian.PutUint32(b[n:], crc32.Checksum(b[:n], castagnoli))
	return b
}

// decodeIndex checks an index file's bytes against the source's key and
// returns its table. A damaged file is a *FormatError naming the index
// file and the offset of the bad field; one built for another version of
// the source wraps ErrStaleIndex.
func decodeIndex(path string, b []byte, want indexKey) (table, error) {
	bad := func(off int64, format string, args ...any) error {
		return &FormatError{Path: path, Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
	}
	if len(b) < indexHeader+12 {
		return table{}, bad(0, "index is %d bytes, too short", len(b))
	}
	if string(b[:8]) != indexMagic {
		return table{}, bad(0, "not a riffle index (magic %q)", b[:8])
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != indexVersion {
		return table{}, &FormatError{Path: path, Offset: 8, Err: fmt.Errorf("index version %d, want %d: %w", v, indexVersion, ErrStaleIndex)}
	}
	n := len(b) - 4
	if got, sum := binary.LittleEndian.Uint32(b[n:]), crc32.Checksum(b[:n], castagnoli); got != sum {
		return table{}, bad(int64(n), "index checksum %08x, computed %08x", got, sum)
	}
	count := binary.LittleEndian.Uint64(b[32:])
	nexc := binary.LittleEndian.Uint64(b[40:])
	body := uint64(n - indexHeader)
	if count >= body/8 || nexc > body/16 || (count+1)*8+nexc*16 != body {
		return table{}, bad(32, "index says %d records and %d exceptions but holds %d bytes after its header", count, nexc, body)
	}
	got := indexKey{
		variant: binary.LittleEndian.Uint32(b[12:]),
		size:    int64(binary.LittleEndian.Uint64(b[16:])),
		version: binary.LittleEndian.Uint64(b[24:]),
	}
	if got != want {
		return table{}, &FormatError{Path: path, Offset: 12, Err: fmt.Errorf(
			"built for size %d version %016x variant %d, source now has size %d version %016x variant %d: %w",
			got.size, got.version, got.variant, want.size, want.version, want.variant, ErrStaleIndex)}
	}
	t := table{offs: make([]int64, count+1)}
	prev := int64(0)
	at := indexHeader
	for i := range t.offs {
		o := int64(binary.LittleEndian.Uint64(b[at:]))
		if o < prev || o > want.size {
			return table{}, bad(int64(at), "offset %d of record %d is out of order or past the source's end", o, i)
		}
		t.offs[i], prev = o, o
		at += 8
	}
	last := -1
	for range nexc {
		r := binary.LittleEndian.Uint64(b[at:])
		e := int64(binary.LittleEndian.Uint64(b[at+8:]))
		if r >= count || int(r) <= last || e < t.offs[r] || e > t.offs[r+1] {
			return table{}, bad(int64(at), "end %d of record %d is out of order or outside the record", e, r)
		}
		t.ends = append(t.ends, recordEnd{record: int(r), end: e})
		last = int(r)
		at += 16
	}
	return t, nil
}

// IndexPaths returns where the sidecar of source may live, in the order they
// are tried: next to the data (unless inDirOnly), then in the cache
// directory.
func IndexPaths(source, cacheDir string, inDirOnly bool) []string {
	abs, err := filepath.Abs(source)
	if err != nil {
		abs = source
	}
	if cacheDir == "" {
		cacheDir = defaultCacheDir()
	}
	h := sha256.Sum256([]byte(abs))
	inCache := filepath.Join(cacheDir, hex.EncodeToString(h[:8])+"-"+filepath.Base(source)+IndexExt)
	if inDirOnly {
		return []string{inCache}
	}
	return []string{source + IndexExt, inCache}
}

func defaultCacheDir() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "riffle")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "riffle")
	}
	return filepath.Join(os.TempDir(), "riffle-cache")
}

// maxIndexBytes bounds a sidecar's size by its source's: a record has at
// least one byte (a newline), so a table has at most size+1 offsets and as
// many exceptions.
func maxIndexBytes(sourceSize int64) int64 { return indexHeader + 24*(sourceSize+2) + 4 }

// loadOrBuild returns source's offset table from a valid sidecar, or builds
// it with build and saves it. The cache directory is the process's own and
// read as a local file; beside the data, the sidecar is read through the
// data's store (and its confinement), as a regular file of bounded size.
func loadOrBuild(ctx context.Context, src storage.Reader, variant uint32, opts Options, build func() (table, error)) (table, error) {
	key := sourceKey(src, variant)
	paths := IndexPaths(src.Name(), opts.IndexDir, opts.IndexInDirOnly)
	local, _ := storage.NewLocal(false, nil)
	storeOf := func(p string) storage.Store {
		if !opts.IndexInDirOnly && p == paths[0] {
			return opts.Store
		}
		return local
	}
	if opts.Index != IndexRebuild {
		var firstErr error
		for _, p := range paths {
			b, err := storeOf(p).ReadFile(ctx, p, maxIndexBytes(src.Size()))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err == nil {
				var t table
				if t, err = decodeIndex(p, b, key); err == nil {
					return t, nil
				}
			}
			if opts.Index == IndexVerify {
				return table{}, err
			}
			if firstErr == nil {
				firstErr = err
			}
		}
		if firstErr != nil {
			slog.Warn("rebuilding index", "source", src.Name(), "reason", firstErr)
		}
		if opts.Index == IndexVerify {
			return table{}, fmt.Errorf("%s: no index to verify (looked in %v): %w", src.Name(), paths, fs.ErrNotExist)
		}
	}
	t, err := build()
	if err != nil {
		return table{}, err
	}
	b := encodeIndex(key, t)
	var saveErr error
	for _, p := range paths {
		if saveErr = storeOf(p).WriteFile(ctx, p, b); saveErr == nil {
			return t, nil
		}
	}
	slog.Warn("index not saved; it will be rebuilt next time", "source", src.Name(), "err", saveErr)
	return t, nil
}
