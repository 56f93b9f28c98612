package dataset

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// The sidecar index of a variable-length file is its offset table: one
// little-endian uint64 per record plus one for the end, 8 bytes per record,
// behind a header that ties it to the source's size and mtime and a trailing
// CRC32C. It sits next to the data as NAME.ridx, or in the cache directory
// when the data's directory is read-only.
//
//	0  magic "RFLIDX01"
//	8  version uint32
//	12 variant uint32 (format and options that change the offsets)
//	16 source size uint64
//	24 source mtime int64 (ns)
//	32 count uint64
//	40 offsets [count+1]uint64
//	.. crc32c uint32 of all bytes before it
const (
	indexMagic   = "RFLIDX01"
	indexVersion = 1
	indexHeader  = 40
	// IndexExt is the sidecar file's extension.
	IndexExt = ".ridx"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type indexKey struct {
	variant uint32
	size    int64
	mtime   int64
}

func sourceKey(path string, variant uint32) (indexKey, error) {
	st, err := os.Stat(path)
	if err != nil {
		return indexKey{}, err
	}
	return indexKey{variant: variant, size: st.Size(), mtime: st.ModTime().UnixNano()}, nil
}

func encodeIndex(k indexKey, offs []int64) []byte {
	b := make([]byte, indexHeader+8*len(offs)+4)
	copy(b, indexMagic)
	binary.LittleEndian.PutUint32(b[8:], indexVersion)
	binary.LittleEndian.PutUint32(b[12:], k.variant)
	binary.LittleEndian.PutUint64(b[16:], uint64(k.size))
	binary.LittleEndian.PutUint64(b[24:], uint64(k.mtime))
	binary.LittleEndian.PutUint64(b[32:], uint64(len(offs)-1))
	for i, o := range offs {
		binary.LittleEndian.PutUint64(b[indexHeader+8*i:], uint64(o))
	}
	n := len(b) - 4
	binary.LittleEndian.PutUint32(b[n:], crc32.Checksum(b[:n], castagnoli))
	return b
}

// decodeIndex checks an index file's bytes against the source's key and
// returns its offsets. A damaged file is a *FormatError naming the index
// file and the offset of the bad field; one built for another version of
// the source wraps ErrStaleIndex.
func decodeIndex(path string, b []byte, want indexKey) ([]int64, error) {
	bad := func(off int64, format string, args ...any) error {
		return &FormatError{Path: path, Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
	}
	if len(b) < indexHeader+12 {
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
	count := binary.LittleEndian.Uint64(b[32:])
	if count+1 != uint64(n-indexHeader)/8 || (n-indexHeader)%8 != 0 {
		return nil, bad(32, "index says %d records but holds %d bytes of offsets", count, n-indexHeader)
	}
	got := indexKey{
		variant: binary.LittleEndian.Uint32(b[12:]),
		size:    int64(binary.LittleEndian.Uint64(b[16:])),
		mtime:   int64(binary.LittleEndian.Uint64(b[24:])),
	}
	if got != want {
		return nil, &FormatError{Path: path, Offset: 12, Err: fmt.Errorf(
			"built for size %d mtime %s variant %d, source now has size %d mtime %s variant %d: %w",
			got.size, time.Unix(0, got.mtime).UTC().Format(time.RFC3339Nano), got.variant,
			want.size, time.Unix(0, want.mtime).UTC().Format(time.RFC3339Nano), want.variant, ErrStaleIndex)}
	}
	offs := make([]int64, count+1)
	prev := int64(0)
	for i := range offs {
		o := int64(binary.LittleEndian.Uint64(b[indexHeader+8*i:]))
		if o < prev || o > want.size {
			return nil, bad(int64(indexHeader+8*i), "offset %d of record %d is out of order or past the source's end", o, i)
		}
		offs[i], prev = o, o
	}
	return offs, nil
}

// IndexPaths returns where the sidecar of source may live, in the order they
// are tried: next to the data, then in the cache directory.
func IndexPaths(source, cacheDir string) []string {
	abs, err := filepath.Abs(source)
	if err != nil {
		abs = source
	}
	if cacheDir == "" {
		cacheDir = defaultCacheDir()
	}
	h := sha256.Sum256([]byte(abs))
	return []string{source + IndexExt, filepath.Join(cacheDir, hex.EncodeToString(h[:8])+"-"+filepath.Base(source)+IndexExt)}
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

// loadOrBuild returns source's offset table from a valid sidecar, or builds
// it with build and saves it.
func loadOrBuild(source string, variant uint32, opts Options, build func() ([]int64, error)) ([]int64, error) {
	key, err := sourceKey(source, variant)
	if err != nil {
		return nil, err
	}
	paths := IndexPaths(source, opts.IndexDir)
	if opts.Index != IndexRebuild {
		var firstErr error
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err == nil {
				var offs []int64
				if offs, err = decodeIndex(p, b, key); err == nil {
					return offs, nil
				}
			}
			if opts.Index == IndexVerify {
				return nil, err
			}
			if firstErr == nil {
				firstErr = err
			}
		}
		if firstErr != nil {
			slog.Warn("rebuilding index", "source", source, "reason", firstErr)
		}
	}
	offs, err := build()
	if err != nil {
		return nil, err
	}
	b := encodeIndex(key, offs)
	var saveErr error
	for _, p := range paths {
		if saveErr = writeAtomic(p, b); saveErr == nil {
			return offs, nil
		}
	}
	slog.Warn("index not saved; it will be rebuilt next time", "source", source, "err", saveErr)
	return offs, nil
}

// writeAtomic writes b to path through a temporary file and a rename, so a
// reader never sees half an index and concurrent builders do not collide.
func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Close()
	} else {
		f.Close()
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
