// Package transform is riffle's one registry of named transforms: work the
// daemon runs on a record once for every job that names the same transform
// with the same parameters (OneAccess §3: preprocessing shared by jobs, and
// persisted so later jobs skip it). A transform's output has a fixed size,
// so a batch of outputs is one array, and its version is part of every key
// its outputs are kept under: a new version never serves an old output.
//
// A transform is named "name" or "name:key=value,key=value"; Parse gives
// its canonical spelling (parameters sorted, defaults filled), which is what
// caches and persisted outputs are keyed by.
//
// Every transform also takes column=NAME, on a dataset of rows (Arrow,
// Parquet, Hugging Face): the column whose values it reads, a binary
// column or the bytes of a Hugging Face Image (struct<bytes, path>); its
// outputs take that column's place in the batch (package loader).
package transform

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Transform turns a record's bytes into its output.
type Transform interface {
	// Size is the bytes of every output.
	Size() int
	// Apply writes the output of raw into out (Size bytes). It is called
	// from many goroutines at once.
	Apply(raw, out []byte) error
	// Shape is the output's numpy dtype ("|u1", "<f4") and shape.
	Shape() (dtype string, shape []int)
}

// Random is a transform whose output also depends on a draw: a number the
// loader makes from the job's seed, the epoch and the record (an
// augmentation's crop and flip). Its outputs are not shared or kept, as
// they differ per job and epoch; the records it reads are.
type Random interface {
	Transform
	ApplyRandom(raw, out []byte, draw uint64) error
}

// Spec names a transform and its parameters.
type Spec struct {
	Name   string
	Params map[string]string
}

// String is the canonical spelling: name:key=value,... sorted by key.
func (s Spec) String() string {
	if len(s.Params) == 0 {
		return s.Name
	}
	keys := make([]string, 0, len(s.Params))
	for k := range s.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(s.Name)
	for i, k := range keys {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + s.Params[k])
	}
	return b.String()
}

// Int reads an integer parameter, def if it is not given.
func (s Spec) Int(key string, def, lo, hi int) (int, error) {
	v, ok := s.Params[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("transform %s: %s=%q: want an integer in [%d, %d]", s.Name, key, v, lo, hi)
	}
	return n, nil
}

// Float reads a number parameter; Parse has filled in its default.
func (s Spec) Float(key string, lo, hi float64) (float64, error) {
	v := s.Params[key]
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= lo && f <= hi) {
		return 0, fmt.Errorf("transform %s: %s=%q: want a number in [%g, %g]", s.Name, key, v, lo, hi)
	}
	return f, nil
}

// Entry is one registered transform.
type Entry struct {
	Name string
	// Version changes whenever outputs change for the same input and
	// parameters; persisted outputs of other versions are never served.
	Version int
	// Params lists the parameters and their defaults, filled in by Parse.
	Params map[string]string
	// New makes the transform for a parsed spec.
	New func(Spec) (Transform, error)
	Doc string
}

var (
	mu       sync.RWMutex
	registry = map[string]Entry{}
)

// Register adds a transform; a second of the same name is a programming error.
func Register(e Entry) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := registry[e.Name]; dup {
		panic("transform: " + e.Name + " registered twice")
	}
	registry[e.Name] = e
}

// Names lists the registered transforms.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	var out []string
	for n := range registry {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ErrUnknown says no transform has that name.
var ErrUnknown = errors.New("unknown transform")

// Parse reads "name[:key=value,...]", checks the keys and fills in the
// defaults.
func Parse(s string) (Spec, Entry, error) {
	name, rest, _ := strings.Cut(s, ":")
	mu.RLock()
	e, ok := registry[name]
	mu.RUnlock()
	if !ok {
		return Spec{}, Entry{}, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, strings.Join(Names(), ", "))
	}
	sp := Spec{Name: name, Params: map[string]string{}}
	for k, v := range e.Params {
		sp.Params[k] = v
	}
	if rest != "" {
		for _, kv := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return Spec{}, Entry{}, fmt.Errorf("transform %s: %q is not key=value", name, kv)
			}
			if _, known := e.Params[k]; !known && k != ColumnParam {
				return Spec{}, Entry{}, fmt.Errorf("transform %s: no parameter %q", name, k)
			}
			if k == ColumnParam && v == "" {
				return Spec{}, Entry{}, fmt.Errorf("transform %s: column= names no column", name)
			}
			sp.Params[k] = v
		}
	}
	return sp, e, nil
}

// ColumnParam is the parameter of every transform that names the column
// of a dataset of rows it reads.
const ColumnParam = "column"

// Column is the column of rows spec s names (its column=), "" if none.
func Column(s string) string {
	sp, _, err := Parse(s)
	if err != nil {
		return ""
	}
	return sp.Params[ColumnParam]
}

// WithColumn is spec s reading column col of a dataset of rows, in its
// canonical spelling: a name the spec's syntax cannot hold (with a comma,
// an equals sign or a colon) is an error.
func WithColumn(s, col string) (string, error) {
	sp, _, err := Parse(s)
	if err != nil {
		return "", err
	}
	if col == "" || strings.ContainsAny(col, ",=:") {
		return "", fmt.Errorf("transform %s: a column named %q cannot be written as column=", sp.Name, col)
	}
	sp.Params[ColumnParam] = col
	return sp.String(), nil
}

// New parses s and makes its transform; it returns the canonical spelling
// with the version, for keys.
func New(s string) (Transform, string, error) {
	sp, e, err := Parse(s)
	if err != nil {
		return nil, "", err
	}
	t, err := e.New(sp)
	if err != nil {
		return nil, "", err
	}
	return t, fmt.Sprintf("%s@v%d", sp, e.Version), nil
}

// Shared is a random transform whose output can also be cut from a
// decoded form of the record, to the same bytes: jobs that share a
// record's read can share its decode too, each cutting its own draw
// (decode once, crop per job).
type Shared interface {
	Random
	// Decode is raw's decoded form; a loader keeps its bytes in a cache.
	Decode(raw []byte) ([]byte, error)
	// FromDecoded writes draw's output from dec (Decode's), and says false,
	// writing nothing, when only the record gives that output's exact
	// bytes (a JPEG box the record would be shrunk for while decoding).
	FromDecoded(dec, out []byte, draw uint64) (bool, error)
}

// Draw is a random transform's draw for record id in epoch of a job
// seeded seed: a hash of the three, so the record's augmentation is the
// same whichever rank, worker or shared job reads it, and after a resume.
func Draw(seed uint64, epoch, id int) uint64 {
	r := rng{seed ^ 0x6472617773} // "draws": apart from other uses of the seed
	r.s ^= r.next() + uint64(epoch)
	r.s ^= r.next() + uint64(id)
	return r.next()
}

// IsRandom says whether t's outputs depend on a draw.
func IsRandom(t Transform) bool {
	_, ok := t.(Random)
	return ok
}
