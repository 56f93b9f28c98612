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

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/storage"
)

// A sidecar index is what one scan of a file learnt, kept next to the data
// as NAME.ridx (or in the cache directory when the data's directory is
// read-only) and reused while the data is unchanged. Its frame ties it to
// the source's size and version (its store's version: device, inode and
// mtime of a local file, the ETag of an object; for a local file its ctime
// too, see sourceKey) and ends in a CRC32C; what it holds depends on the
// format:
//
//	0  magic "RFLIDX01"
//	8  version uint32
//	12 variant uint32 (format and options that change what it holds)
//	16 source size uint64
//	24 source version hash uint64 (FNV-1a of the version string, and
//	   since version 4 of a local file's ctime)
//	32 payload
//	.. crc32c uint32 of all bytes before it
//
// For a variable-length record format the payload is its offset table: one
// little-endian uint64 per record plus one for the end, 8 bytes per record.
// Records whose end is not where the next begins (a line followed by blank
// lines, a last line without its newline) are listed after the offsets
// with their ends; most files have none.
//
//	32 count uint64
//	40 exceptions uint64
//	48 offsets [count+1]uint64
//	.. exceptions [exceptions](record uint64, end uint64), by record
const (
	indexMagic = "RFLIDX01"
	// indexVersion 4: the source version hash covers a local file's
	// ctime; a version 3 index is stale (ErrStaleIndex) and rebuilt.
	indexVersion = 4
	indexFrame   = 32
	indexHeader  = indexFrame + 16 // an offset table's header
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

// sourceKey is what an index of r must have been built for. A local
// file's version by size and mtime alone does not see an edit
// in place that restores the size and the mtime (rsync --inplace -t,
// cp -p onto the file, a tool that calls utime afterwards): an index
// reused then points every record at the wrong bytes, and nothing fails.
// The ctime is set by the kernel on every change and utime cannot set it
// back, so it goes into the key too, read from the open file (fstat) so
// it is the ctime of the bytes being indexed. A chmod or a hard link
// changes it as well: that costs one rebuild, never a wrong record.
func sourceKey(r storage.Reader, variant uint32) indexKey {
	h := fnv.New64a()
	h.Write([]byte(version(r)))
	if ct, ok := changeTime(r); ok {
		fmt.Fprintf(h, "\x00ctime %d", ct)
	}
	return indexKey{variant: variant, size: r.Size(), version: h.Sum64()}
}

// changeTime is the ctime, in nanoseconds, of a reader of a local file
// (one with a descriptor).
func changeTime(r storage.Reader) (int64, bool) {
	f, ok := storage.As[storage.Descriptor](r)
	if !ok {
		return 0, false
	}
	var st unix.Stat_t
	if unix.Fstat(f.Fd(), &st) != nil {
		return 0, false
	}
	return st.Ctim.Nano(), true
}

// frameIndex puts a payload in the sidecar's frame.
func frameIndex(k indexKey, payload []byte) []byte {
	b := make([]byte, indexFrame+len(payload)+4)
	copy(b, indexMagic)
	binary.LittleEndian.PutUint32(b[8:], indexVersion)
	binary.LittleEndian.PutUint32(b[12:], k.variant)
	binary.LittleEndian.PutUint64(b[16:], uint64(k.size))
	binary.LittleEndian.PutUint64(b[24:], k.version)
	copy(b[indexFrame:], payload)
	n := len(b) - 4
	binary.LittleEndian.PutUint32(b[n:], crc32.Checksum(b[:n], castagnoli))
	return b
}

// unframeIndex checks a sidecar's frame against the source's key and
// returns its payload. A damaged file is a *FormatError naming the index
// file and the offset of the bad field; one built for another version of
// the source wraps ErrStaleIndex.
func unframeIndex(path string, b []byte, want indexKey) ([]byte, error) {
	bad := func(off int64, format string, args ...any) error {
		return &FormatError{Path: path, Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
	}
	if len(b) < indexFrame+4 {
		return nil, bad(0, "index is %d bytes, too short", len(b))
	}
	if string(b[:8]) != indexMagic {
		return nil, bad(0, "not a riffle index (magic %q)", b[:8])
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != indexVersion {
		return nil, &FormatError{Path: path, Offset: 8, Err: fmt.Errorf("index version %d, want %d: %w", v, indexVersion, ErrStaleIndex)}
	}
	n := len(b) - 4
	if got, sum := binary.LittleEndian.Uint32(b[n:]), crc32.Checksum(b[:n], castagnoli); got != sum {
		return nil, bad(int64(n), "index checksum %08x, computed %08x", got, sum)
	}
	got := indexKey{
		variant: binary.LittleEndian.Uint32(b[12:]),
		size:    int64(binary.LittleEndian.Uint64(b[16:])),
		version: binary.LittleEndian.Uint64(b[24:]),
	}
	if got != want {
		return nil, &FormatError{Path: path, Offset: 12, Err: fmt.Errorf(
			"built for size %d version %016x variant %d, source now has size %d version %016x variant %d: %w",
			got.size, got.version, got.variant, want.size, want.version, want.variant, ErrStaleIndex)}
	}
	return b[indexFrame:n], nil
}

// writeIndex writes an offset table's sidecar.
func writeIndex(k indexKey, t table) []byte {
	w := wordWriter{b: make([]byte, 0, 16+8*len(t.offs)+16*len(t.ends))}
	w.Int(int64(len(t.offs)-1), int64(len(t.ends)))
	w.Int(t.offs...)
	for _, e := range t.ends {
		w.Int(int64(e.record), e.end)
	}
	return frameIndex(k, w.Bytes())
}

// shape is what a format's records are in its file, which an offset table
// read from disk is checked against: each record's span (from its offset
// to the next's) holds at least min bytes (its frame: a TFRecord's length,
// CRCs and none of data, 16; a line's newline, 1; a tar member's header,
// 512), a record listed with its own end ends at least head bytes after
// its offset, and each record starts at a multiple of align. A table that
// breaks them (zero-width records, which reached the client as length -1
// and panicked the loader) was not made by a scan of the format.
type shape struct{ head, min, align int64 }

// readIndex checks an offset table's sidecar and returns its table.
func readIndex(path string, b []byte, want indexKey, sh shape) (table, error) {
	p, err := unframeIndex(path, b, want)
	if err != nil {
		return table{}, err
	}
	bad := func(off int64, format string, args ...any) error {
		return &FormatError{Path: path, Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
	}
	r, err := newWordReader(p)
	if err != nil || len(p) < 24 {
		return table{}, bad(indexFrame, "offset table of %d bytes, too short or not whole words", len(p))
	}
	var count, nexc int64
	if err := r.Ints(&count, &nexc); err != nil {
		return table{}, bad(indexFrame, "%v", err)
	}
	if left := int64(r.Left()); count < 0 || nexc < 0 || count >= left || nexc > left/2 || count+1+2*nexc != left {
		return table{}, bad(indexFrame, "index says %d records and %d exceptions but holds %d bytes after its header", count, nexc, 8*left)
	}
	t := table{offs: make([]int64, count+1)}
	for i := range t.offs {
		at := r.Off()
		o, err := r.Int()
		if err != nil {
			return table{}, bad(int64(indexFrame+at), "%v", err)
		}
		if o < 0 || o > want.size || i > 0 && o < t.offs[i-1] || i < int(count) && sh.align > 1 && o%sh.align != 0 {
			return table{}, bad(int64(indexFrame+at), "offset %d of record %d is out of order, past the source's end of %d or not a multiple of %d", o, i, want.size, max(1, sh.align))
		}
		t.offs[i] = o
	}
	last := int64(-1)
	for range nexc {
		at := r.Off()
		var rec, e int64
		if err := r.Ints(&rec, &e); err != nil {
			return table{}, bad(int64(indexFrame+at), "%v", err)
		}
		if rec < 0 || rec >= count || rec <= last || e < t.offs[rec]+sh.head || e > t.offs[rec+1] {
			return table{}, bad(int64(indexFrame+at), "end %d of record %d is out of order or outside the record", e, rec)
		}
		t.ends = append(t.ends, recordEnd{record: int(rec), end: e})
		last = rec
	}
	// A record without an end of its own spans to the next: its frame,
	// at least.
	k := 0
	for i := range int(count) {
		for k < len(t.ends) && t.ends[k].record < i {
			k++
		}
		if k < len(t.ends) && t.ends[k].record == i {
			continue
		}
		if t.offs[i+1]-t.offs[i] < sh.min {
			return table{}, bad(int64(indexFrame+16+8*i), "record %d spans %d bytes (%d to %d), less than its format's %d", i, t.offs[i+1]-t.offs[i], t.offs[i], t.offs[i+1], sh.min)
		}
	}
	return t, nil
}

// IndexPaths returns where the sidecar of source may live, in the order they
// are tried: next to the data (unless inDirOnly), then in the cache
// directory.
func IndexPaths(source, cacheDir string, inDirOnly bool) []string {
	abs, err := filepath.Abs(source)
	if err != nil || storage.IsS3(source) {
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

// CacheDir is where riffle keeps what it works out about data (indexes,
// record hashes) when no directory is given: dir, or the default.
func CacheDir(dir string) string {
	if dir != "" {
		return dir
	}
	return defaultCacheDir()
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
// it with build and saves it.
func loadOrBuild(ctx context.Context, src storage.Reader, variant uint32, opts Options, sh shape, build func() (table, error)) (table, error) {
	var t table
	err := loadOrBuildIndex(ctx, src, variant, opts, maxIndexBytes(src.Size()),
		func(path string, b []byte, key indexKey) (err error) {
			t, err = readIndex(path, b, key, sh)
			return err
		},
		func(key indexKey) ([]byte, error) {
			var err error
			if t, err = build(); err != nil {
				return nil, err
			}
			return writeIndex(key, t), nil
		})
	return t, err
}

// loadOrBuildFramed is loadOrBuildIndex for formats whose index is a
// payload of their own inside the common frame (Arrow, Parquet): read
// takes the payload, and one it refuses is a corrupt index; build returns
// a new payload.
func loadOrBuildFramed(ctx context.Context, src storage.Reader, variant uint32, opts Options,
	read func(payload []byte) error, build func() ([]byte, error)) error {
	return loadOrBuildIndex(ctx, src, variant, opts, 64*src.Size()+1<<20,
		func(path string, b []byte, key indexKey) error {
			p, err := unframeIndex(path, b, key)
			if err != nil {
				return err
			}
			if err := read(p); err != nil {
				return &FormatError{Path: path, Offset: indexFrame, Err: fmt.Errorf("%v: %w", err, ErrCorrupt)}
			}
			return nil
		},
		func(key indexKey) ([]byte, error) {
			p, err := build()
			if err != nil {
				return nil, err
			}
			return frameIndex(key, p), nil
		})
}

// loadOrBuildIndex loads source's sidecar with read, or builds it with
// build (which returns the framed sidecar) and saves it. The cache
// directory is the process's own, read and written through privdir: it
// must be owned by this user and writable by no one else (another user
// could plant an index that reads records wrong), it is made 0700 (its
// listing names the datasets indexed) and its files 0600, opened with
// O_NOFOLLOW. Beside local data, the sidecar is trusted as that directory
// is (besideTrusted): read through the data's store (and its
// confinement), as a regular file of at most limit bytes, only from a
// directory, and of an owner and mode, that privdir would trust, and
// written only into such a directory; else it is built and kept in the
// cache directory, and one another user planted beside the data is never
// read.
func loadOrBuildIndex(ctx context.Context, src storage.Reader, variant uint32, opts Options, limit int64,
	read func(path string, b []byte, key indexKey) error, build func(key indexKey) ([]byte, error)) error {
	key := sourceKey(src, variant)
	paths := IndexPaths(src.Name(), opts.IndexDir, opts.IndexInDirOnly)
	beside := func(p string) bool { return !opts.IndexInDirOnly && p == paths[0] }
	readFile := func(p string) ([]byte, error) {
		if beside(p) {
			return readBeside(ctx, opts.Store, p, limit)
		}
		d, err := privdir.Open(filepath.Dir(p))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		return d.ReadFile(filepath.Base(p), limit)
	}
	writeFile := func(p string, b []byte) error {
		if beside(p) {
			if err := besideTrusted(p); err != nil {
				return err
			}
			return opts.Store.WriteFile(ctx, p, b)
		}
		d, err := privdir.Open(filepath.Dir(p))
		if err != nil {
			return err
		}
		defer d.Close()
		return d.WriteFile(filepath.Base(p), b)
	}
	if opts.Index != IndexRebuild {
		var firstErr error
		for _, p := range paths {
			b, err := readFile(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if errors.Is(err, privdir.ErrNotPrivate) {
				// Another user may write there: the index is the index
				// directory's (a log line a file of a dataset would be
				// thousands an open).
				slog.Debug("index beside the data not used", "source", src.Name(), "reason", err)
				continue
			}
			if err == nil {
				if err = read(p, b, key); err == nil {
					return nil
				}
			}
			if opts.Index == IndexVerify {
				return err
			}
			if firstErr == nil {
				firstErr = err
			}
		}
		if firstErr != nil {
			slog.Warn("rebuilding index", "source", src.Name(), "reason", firstErr)
		}
		if opts.Index == IndexVerify {
			return fmt.Errorf("%s: no index to verify (looked in %v): %w", src.Name(), paths, fs.ErrNotExist)
		}
	}
	b, err := build(key)
	if err != nil {
		return err
	}
	var saveErr error
	for _, p := range paths {
		if saveErr = writeFile(p, b); saveErr == nil {
			return nil
		}
	}
	slog.Warn("index not saved; it will be rebuilt next time", "source", src.Name(), "err", saveErr)
	return nil
}

// besideTrusted says whether the directory of a sidecar beside local
// data is one privdir would trust (owned by this user, writable by no
// one else): where another user may write, they may plant an index that
// reads every record at offsets of their choosing, its checksum fixed
// up. An object store's directory is trusted as its data is.
func besideTrusted(p string) error {
	if storage.IsS3(p) {
		return nil
	}
	dir := filepath.Dir(p)
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	return privdir.Trusted(dir, &st)
}

// readBeside reads the sidecar p beside the data through the store, if
// its directory is trusted (besideTrusted) and the file it opened is too:
// owned by this user and writable by no one else, as fstat says of the
// descriptor read, so a file swapped in after the directory's check is
// refused, not read. A local file read through no descriptor (a store
// that wraps its readers) cannot be checked, and is refused.
func readBeside(ctx context.Context, store storage.Store, p string, limit int64) ([]byte, error) {
	if storage.IsS3(p) {
		return store.ReadFile(ctx, p, limit)
	}
	if err := besideTrusted(p); err != nil {
		return nil, err
	}
	r, err := store.Open(ctx, p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, ok := storage.As[storage.Descriptor](r)
	if !ok {
		return nil, fmt.Errorf("%s: read through a %T, whose owner cannot be checked: %w", p, r, privdir.ErrNotPrivate)
	}
	var st unix.Stat_t
	if err := unix.Fstat(f.Fd(), &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	if err := privdir.Trusted(p, &st); err != nil {
		return nil, err
	}
	if r.Size() > limit {
		return nil, fmt.Errorf("%s: %w: %d bytes, at most %d", p, storage.ErrTooLarge, r.Size(), limit)
	}
	b := make([]byte, r.Size())
	if err := r.ReadAt(ctx, b, 0); err != nil {
		return nil, err
	}
	return b, nil
}
