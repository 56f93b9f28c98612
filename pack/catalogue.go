package pack

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/riffle-ml/riffle/dataset"
)

// A catalogue is a directory of persisted transform outputs, one pack
// each, named by a key of (source files, transform with its version).
// Its packs record the versions of the files they were made from (device,
// inode, mtime, size): an output whose source has changed since is stale,
// and never served; riffle cache gc removes it.
type Catalogue struct{ Dir string }

// DefaultCatalogue is $RIFFLE_CACHE_DIR/outputs, else the user's cache
// directory's riffle/outputs.
func DefaultCatalogue() Catalogue {
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

// Lookup finds a whole, current output of transform over the source whose
// files and versions are given.
func (c Catalogue) Lookup(paths, versions []string, transform string) (string, bool) {
	dir := c.Path(Key(paths, transform))
	m, err := readManifest(dir)
	if err != nil || !m.Complete || m.Transform != transform || Stale(m, versions) {
		return "", false
	}
	now := time.Now()
	os.Chtimes(filepath.Join(dir, dataset.PackManifest), now, now) // last used, for gc
	return dir, true
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
	des, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, de := range des {
		if !de.IsDir() {
			continue
		}
		dir := filepath.Join(c.Dir, de.Name())
		e := Entry{Key: de.Name(), Dir: dir}
		if m, err := readManifest(dir); err == nil {
			e.Manifest = m
			var now []string
			for _, p := range m.Source.Paths {
				now = append(now, versions(p))
			}
			e.Stale = Stale(m, now) || !m.Complete
		} else {
			e.Stale = true
		}
		if st, err := os.Stat(filepath.Join(dir, dataset.PackManifest)); err == nil {
			e.Used = st.ModTime()
		}
		filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if info, err := d.Info(); err == nil {
					e.Bytes += info.Size()
				}
			}
			return nil
		})
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
	des, err := os.ReadDir(c.Dir)
	if err != nil {
		return err
	}
	var match []string
	for _, de := range des {
		if strings.HasPrefix(de.Name(), key) {
			match = append(match, de.Name())
		}
	}
	if len(match) != 1 {
		return fmt.Errorf("cache: %q names %d outputs", key, len(match))
	}
	return os.RemoveAll(c.Path(match[0]))
}

// GC removes stale outputs, then the least recently used, until the rest
// take at most maxBytes (negative: only the stale). It returns what it
// removed.
func (c Catalogue) GC(maxBytes int64, versions func(path string) string) ([]Entry, error) {
	es, err := c.List(versions)
	if err != nil {
		return nil, err
	}
	var removed []Entry
	var keep []Entry
	total := int64(0)
	for _, e := range es {
		if e.Stale {
			if err := os.RemoveAll(e.Dir); err != nil {
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
		if err := os.RemoveAll(e.Dir); err != nil {
			return removed, err
		}
		removed = append(removed, e)
		total -= e.Bytes
	}
	return removed, nil
}
