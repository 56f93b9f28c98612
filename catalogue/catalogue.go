// Package catalogue is the directory of persisted transform outputs
// (OneAccess's persisted preprocessing, oneaccess.txt §3): riffle pack
// --transform writes an output there, and the daemon serves it in place of
// running the transform while its source is unchanged. The daemon reads
// the catalogue; it does not import the pack writer.
package catalogue

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/privdir"
)

// A catalogue is a directory of persisted transform outputs, one pack
// each, named by a key of (source files, transform with its version).
// Its packs record the versions of the files they were made from (device,
// inode, mtime, size, ctime): an output whose source has changed since is stale,
// and never served; riffle catalogue gc removes it.
//
// The daemon serves what it finds there as the transform's output, so the
// directory must be its user's alone (internal/privdir): made 0700,
// refused if another user owns it or anyone else may write it (that user
// could plant shards with valid CRCs); an output is served only if its
// directory passes the same check and its manifest and shards are regular
// files, read without following a symlink.
type Catalogue struct{ Dir string }

// Default is $RIFFLE_CACHE_DIR/outputs, else the user's cache
// directory's riffle/outputs.
func Default() Catalogue {
	if d := os.Getenv("RIFFLE_CACHE_DIR"); d != "" {
		return Catalogue{Dir: filepath.Join(d, "outputs")}
	}
	if d, err := os.UserCacheDir(); err == nil {
		return Catalogue{Dir: filepath.Join(d, "riffle", "outputs")}
	}
	return Catalogue{Dir: filepath.Join(os.TempDir(), "riffle-cache", "outputs")}
}

// Key names the output of transform (canonical, with its version) over
// the source files paths.
func Key(paths []string, transform string) string {
	h := sha256.New()
	for _, p := range paths {
		fmt.Fprintf(h, "%q\n", p)
	}
	fmt.Fprintf(h, "%q\n", transform)
	return hex.EncodeToString(h.Sum(nil))[:20]
}

// Path is where key's pack lives.
func (c Catalogue) Path(key string) string { return filepath.Join(c.Dir, key) }

// open opens the catalogue's directory, making it if it is not there.
func (c Catalogue) open() (*privdir.Dir, error) {
	d, err := privdir.Open(c.Dir)
	if err != nil {
		return nil, fmt.Errorf("catalogue of outputs: %w", err)
	}
	return d, nil
}

// isKey says a name in the catalogue is an output's (Key's form): nothing
// else there is listed or removed.
func isKey(name string) bool {
	if len(name) != 20 {
		return false
	}
	for _, r := range name {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}

// maxManifest bounds a manifest's size (a pack of millions of shards has
// a manifest of a few hundred MiB at most).
const maxManifest = 1 << 30

// manifestIn reads the manifest of the output directory d.
// ReadManifest reads the manifest of the pack in d, without following a
// symlink.
func ReadManifest(d *privdir.Dir) (*dataset.PackManifestFile, error) {
	b, err := d.ReadFile(dataset.PackManifest, maxManifest)
	if err != nil {
		return nil, err
	}
	var m dataset.PackManifestFile
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("pack: %s: %w", filepath.Join(d.Path(), dataset.PackManifest), err)
	}
	return &m, nil
}

// Prepare makes the catalogue's directory and the directory of key's
// output, both 0700, checking that they are private, and returns the
// output's path for Pack to write into.
func (c Catalogue) Prepare(key string) (string, error) {
	if !isKey(key) {
		return "", fmt.Errorf("cache: %q is not a key", key)
	}
	d, err := c.open()
	if err != nil {
		return "", err
	}
	defer d.Close()
	sub, err := d.Mkdir(key)
	if err != nil {
		return "", fmt.Errorf("catalogue of outputs: %w", err)
	}
	sub.Close()
	return c.Path(key), nil
}

// Lookup finds a whole, current output of transform over the source whose
// files and versions are given. An output in a directory that is not
// private, or whose manifest or shards are not regular files of the sizes
// the manifest says (a symlink planted in a shard's place), is not found.
func (c Catalogue) Lookup(paths, versions []string, transform string) (string, bool) {
	key := Key(paths, transform)
	d, err := c.open()
	if err != nil {
		slog.Warn("not reading persisted outputs", "err", err)
		return "", false
	}
	defer d.Close()
	sub, err := d.OpenDir(key)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			slog.Warn("not reading a persisted output", "err", err)
		}
		return "", false
	}
	defer sub.Close()
	m, err := ReadManifest(sub)
	if err != nil || !m.Complete || m.Transform != transform || Stale(m, versions) {
		return "", false
	}
	for _, s := range m.Shards {
		mode, size, err := sub.Lstat(s.Name)
		if err != nil || !mode.IsRegular() || size != s.Bytes {
			slog.Warn("not reading a persisted output: a shard is not the regular file its manifest says",
				"dir", sub.Path(), "shard", s.Name, "mode", mode, "size", size, "want", s.Bytes, "err", err)
			return "", false
		}
	}
	sub.Touch(dataset.PackManifest) // last used, for gc
	return c.Path(key), true
}

// Entry is one output of a catalogue.
type Entry struct {
	Key      string
	Dir      string
	Manifest *dataset.PackManifestFile
	Bytes    int64
	Used     time.Time
	Stale    bool
}

// List lists the catalogue's outputs; versions says a path's current
// version ("" if it is gone), for staleness.
func (c Catalogue) List(versions func(path string) string) ([]Entry, error) {
	if _, err := os.Stat(c.Dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	d, err := c.open()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	des, err := d.ReadDir()
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, de := range des {
		if !de.IsDir() || !isKey(de.Name()) {
			continue
		}
		e := Entry{Key: de.Name(), Dir: c.Path(de.Name()), Stale: true}
		sub, err := d.OpenDir(de.Name())
		if err != nil {
			// Not private: never served, so stale; gc removes it.
			out = append(out, e)
			continue
		}
		if m, err := ReadManifest(sub); err == nil {
			e.Manifest = m
			e.Stale = Stale(m, sourceVersions(m.Source, versions)) || !m.Complete
		}
		files, _ := sub.ReadDir()
		for _, f := range files {
			if info, err := f.Info(); err == nil && f.Type().IsRegular() {
				e.Bytes += info.Size()
				if f.Name() == dataset.PackManifest {
					e.Used = info.ModTime()
				}
			}
		}
		sub.Close()
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Used.After(out[j].Used) })
	return out, nil
}

// Remove removes the output of key (a key, or a unique prefix of one).
func (c Catalogue) Remove(key string) error {
	if key == "" || strings.ContainsAny(key, "/\\.") {
		return fmt.Errorf("cache: %q is not a key", key)
	}
	d, err := c.open()
	if err != nil {
		return err
	}
	defer d.Close()
	des, err := d.ReadDir()
	if err != nil {
		return err
	}
	var match []string
	for _, de := range des {
		if isKey(de.Name()) && strings.HasPrefix(de.Name(), key) {
			match = append(match, de.Name())
		}
	}
	if len(match) != 1 {
		return fmt.Errorf("cache: %q names %d outputs", key, len(match))
	}
	return d.RemoveAll(match[0])
}

// GC removes stale outputs, then the least recently used, until the rest
// take at most maxBytes (negative: only the stale). It returns what it
// removed.
func (c Catalogue) GC(maxBytes int64, versions func(path string) string) ([]Entry, error) {
	es, err := c.List(versions)
	if err != nil || len(es) == 0 {
		return nil, err
	}
	d, err := c.open()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	var removed []Entry
	var keep []Entry
	total := int64(0)
	for _, e := range es {
		if e.Stale {
			if err := d.RemoveAll(e.Key); err != nil {
				return removed, err
			}
			removed = append(removed, e)
			continue
		}
		keep = append(keep, e)
		total += e.Bytes
	}
	// keep is most recently used first: drop from its end.
	for maxBytes >= 0 && total > maxBytes && len(keep) > 0 {
		e := keep[len(keep)-1]
		keep = keep[:len(keep)-1]
		if err := d.RemoveAll(e.Key); err != nil {
			return removed, err
		}
		removed = append(removed, e)
		total -= e.Bytes
	}
	return removed, nil
}

// Stale reports whether a pack's source has changed since it was packed:
// its files' versions (device, inode, mtime, size, ctime) differ.
func Stale(m *dataset.PackManifestFile, versions []string) bool {
	return !slices.Equal(m.Source.Versions, versions)
}

// sourceVersions are the versions of a pack's source now, named as the
// source named them when it was packed: a directory (ImageFolder) dataset
// has its root's version and then each class folder's, sorted by name, as
// the dataset's Info does, so that a listing does not call a current
// output stale (the daemon's Lookup compares the dataset's own).
func sourceVersions(src dataset.PackSource, versions func(path string) string) []string {
	names := src.Paths
	if src.Format == "dir" && len(src.Paths) == 1 && len(src.Versions) > 1 {
		names = []string{src.Paths[0]}
		if des, err := os.ReadDir(src.Paths[0]); err == nil {
			for _, de := range des { // sorted by name
				if de.IsDir() {
					names = append(names, filepath.Join(src.Paths[0], de.Name()))
				}
			}
		}
	}
	out := make([]string, 0, len(names))
	for _, p := range names {
		out = append(out, versions(p))
	}
	return out
}
