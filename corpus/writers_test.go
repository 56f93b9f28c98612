package corpus_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// Corpora as other writers make them (testdata/writers.py): megatron-core's
// IndexedDatasetBuilder, numpy's tofile (nanoGPT) and np.save (OLMo-core),
// Hugging Face datasets' save_to_disk, over real text tokenized by a BPE
// trained on it with Hugging Face tokenizers, so documents are as long as
// paragraphs of prose are. Each reads back equal to what the writer's own
// reader reads.

// python is the test virtualenv's interpreter (scripts/install-deps.sh).
func python(t *testing.T) string {
	t.Helper()
	dir, _ := os.Getwd()
	for ; dir != "/"; dir = filepath.Dir(dir) {
		if p := filepath.Join(dir, ".venv", "bin", "python"); fileExists(p) {
			return p
		}
	}
	t.Skip("no .venv: scripts/install-deps.sh makes it")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func run(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(python(t), append([]string{"testdata/writers.py"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("writers.py %s: %v\n%s", args[0], err, out)
	}
}

type written struct {
	EOD      int64                `json:"eod"`
	Vocab    int64                `json:"vocab"`
	Megatron map[string][][]int64 `json:"megatron"`
	Flat     []int64              `json:"flat"`
	Npy      [][]int64            `json:"npy"`
	HF       [][]int64            `json:"hf"`
}

// texts are real prose on the machine: the project's docs and the
// system's licenses.
func texts(t *testing.T) []string {
	var out []string
	for _, g := range []string{"../README.md", "../BENCHMARKS.md", "../docs/*.md", "/usr/share/common-licenses/*"} {
		m, _ := filepath.Glob(g)
		for _, p := range m {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				out = append(out, p)
			}
		}
	}
	if len(out) == 0 {
		t.Skip("no text to tokenize")
	}
	return out
}

func readDocs(t *testing.T, c *corpus.Corpus) [][]int64 {
	t.Helper()
	out := make([][]int64, c.Docs())
	for d := range out {
		out[d] = make([]int64, c.Len(d))
		if err := c.Read(context.Background(), d, 0, out[d]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func same(t *testing.T, what string, got, want [][]int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d documents, the writer's reader %d", what, len(got), len(want))
	}
	for d := range got {
		if !slices.Equal(got[d], want[d]) {
			t.Fatalf("%s: document %d is %v, the writer's reader %v", what, d, got[d], want[d])
		}
	}
}

func TestIndependentWriters(t *testing.T) {
	dir := t.TempDir()
	run(t, append([]string{"write", dir}, texts(t)...)...)
	var w written
	b, err := os.ReadFile(filepath.Join(dir, "want.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	open := func(opts corpus.Options, names ...string) *corpus.Corpus {
		t.Helper()
		opts.Vocab = w.Vocab
		c, err := corpus.Open(ctx, opts, names...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for name, want := range w.Megatron {
		c := open(corpus.Options{}, filepath.Join(dir, name))
		same(t, name, readDocs(t, c), want)
		if name == "mega_mm" && !c.Info().Multimodal {
			t.Fatalf("%s: not seen as multimodal", name)
		}
	}
	var lens []int
	for _, d := range w.Megatron["mega_u16"] {
		lens = append(lens, len(d))
	}
	slices.Sort(lens)
	t.Logf("%d documents, lengths %d to %d, median %d, vocabulary %d", len(lens), lens[0], lens[len(lens)-1], lens[len(lens)/2], w.Vocab)

	// An image among the sequences of a multimodal index is refused by name.
	_, err = corpus.Open(ctx, corpus.Options{}, filepath.Join(dir, "mega_img"))
	if !errors.Is(err, corpus.ErrUnsupported) || !strings.Contains(err.Error(), "sequence 39 has mode 1") {
		t.Fatalf("a multimodal index with an image: %v", err)
	}

	flat := open(corpus.Options{Dtype: corpus.Uint16, EOD: w.EOD, HasEOD: true}, filepath.Join(dir, "train.bin"))
	same(t, "nanoGPT train.bin", readDocs(t, flat), [][]int64{w.Flat})
	npy := open(corpus.Options{EOD: w.EOD, HasEOD: true}, filepath.Join(dir, "part-*.npy"))
	if npy.Dtype() != corpus.Uint32 {
		t.Fatalf("npy dtype %s", npy.Dtype())
	}
	same(t, "OLMo .npy", readDocs(t, npy), w.Npy)
	hf := open(corpus.Options{IndexDir: t.TempDir(), IndexInDirOnly: true}, filepath.Join(dir, "hf"))
	same(t, "Hugging Face save_to_disk", readDocs(t, hf), w.HF)

	// The flat file's EOD documents, written as a Megatron index beside
	// it, are megatron-core's own documents.
	elens, err := corpus.EODLengths(ctx, flat)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create(filepath.Join(dir, "train.idx"))
	if err := corpus.WriteIndex(f, corpus.Uint16, elens); err != nil {
		t.Fatal(err)
	}
	f.Close()
	same(t, "train.bin with its EOD index", readDocs(t, open(corpus.Options{}, filepath.Join(dir, "train"))), w.Megatron["mega_u16"])
}

// TestConcatAgainstNumpy: concat samples of a real corpus, read through
// corpus and sequence, equal numpy's cut of megatron-core's documents
// concatenated in the same order.
func TestConcatAgainstNumpy(t *testing.T) {
	dir := t.TempDir()
	run(t, append([]string{"write", dir}, texts(t)...)...)
	ctx := context.Background()
	prefix := filepath.Join(dir, "mega_u16")
	c, err := corpus.Open(ctx, corpus.Options{}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const seed, epoch, S = 11, 2, 64
	order := sampler.Order(sampler.Global{N: c.Docs(), Seed: seed}, epoch)
	ob, _ := json.Marshal(order)
	os.WriteFile(filepath.Join(dir, "order.json"), ob, 0o644)
	run(t, "concat", prefix, filepath.Join(dir, "order.json"), "64", filepath.Join(dir, "want.npy"))
	want := readNpy2D(t, filepath.Join(dir, "want.npy"))
	s, err := sequence.New(c, sequence.Options{SeqLen: S, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	if s.Len(epoch) != len(want) {
		t.Fatalf("%d samples, numpy %d", s.Len(epoch), len(want))
	}
	var pieces []sequence.Piece
	var toks []int64
	for i := range s.Len(epoch) {
		if pieces, err = s.Sample(epoch, i, pieces[:0]); err != nil {
			t.Fatal(err)
		}
		if toks, err = sequence.Read(ctx, c, pieces, toks); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(toks, want[i]) {
			t.Fatalf("sample %d: %v, numpy %v", i, toks, want[i])
		}
	}
	// best_fit's padding against concat's cuts, on real documents.
	for _, S := range []int{128, 512, 2048} {
		bf, _ := sequence.New(c, sequence.Options{SeqLen: S, Mode: sequence.BestFit, Seed: seed})
		cc, _ := sequence.New(c, sequence.Options{SeqLen: S, Seed: seed})
		b, k := bf.Stats(0), cc.Stats(0)
		t.Logf("seq_len %d: best_fit %d samples, padding %.2f%%, documents split %.2f%%; concat %d samples, documents cut %.2f%%, tokens dropped %.3f%%",
			S, b.Samples, 100*b.PaddingRate(), 100*b.CutRate(), k.Samples, 100*k.CutRate(), 100*k.DropRate())
	}
}

// readNpy2D reads a 2-D int64 .npy.
func readNpy2D(t *testing.T, p string) [][]int64 {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h, err := dataset.ParseNpyHeader(b)
	if err != nil || h.Descr != "<i8" || len(h.Shape) != 2 {
		t.Fatalf("%s: %+v %v", p, h, err)
	}
	out := make([][]int64, h.Shape[0])
	at := h.DataOffset
	for i := range out {
		out[i] = make([]int64, h.Shape[1])
		for k := range out[i] {
			out[i][k] = int64(binary.LittleEndian.Uint64(b[at:]))
			at += 8
		}
	}
	return out
}

// flipStore is the local store whose reads flip a bit of the byte at
// offset at (once set above 0), as a disk or a network might.
type flipStore struct {
	storage.Store
	at atomic.Int64
}

func (s *flipStore) Open(ctx context.Context, name string) (storage.Reader, error) {
	r, err := s.Store.Open(ctx, name)
	return &flipReader{Reader: r, s: s}, err
}

type flipReader struct {
	storage.Reader
	s *flipStore
}

func (r *flipReader) ReadAt(ctx context.Context, p []byte, off int64) error {
	err := r.Reader.ReadAt(ctx, p, off)
	if at := r.s.at.Load(); at > 0 && at >= off && at < off+int64(len(p)) {
		p[at-off] ^= 0x10
	}
	return err
}

// TestColumnWriters: a tokenized column as pyarrow writes it to Parquet
// (snappy, zstd, gzip, none with page CRCs; row groups and pages;
// dictionary encoding off and on; data pages v1 and v2; int32, int64,
// uint16, uint32 tokens; a large_list) and to compressed Feather (lz4, zstd), and as Hugging Face
// datasets' to_parquet writes it, reads back equal to pyarrow's reading;
// and a job's samples of each, in every packing, on 2 ranks stopped and
// resumed, are sample for sample those of the same documents written as
// uncompressed Arrow (rows that are byte ranges).
func TestColumnWriters(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(python(t), append([]string{"testdata/writers.py", "columns", dir}, texts(t)...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("writers.py columns: %v\n%s", err, out)
	}
	var w struct {
		Vocab int64                `json:"vocab"`
		Files map[string][][]int64 `json:"files"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "columns.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dtypes := map[string]corpus.Dtype{"u16.parquet": corpus.Uint16, "u32_large.parquet": corpus.Uint32, "i64_gzip.parquet": corpus.Int64,
		"zstd.arrow": corpus.Int64} // datasets writes input_ids as int32 (its optimized integer lists)
	for name, want := range w.Files {
		c, err := corpus.Open(ctx, corpus.Options{Vocab: w.Vocab, IndexDir: t.TempDir(), IndexInDirOnly: true}, filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d, ok := dtypes[name]; !ok && c.Dtype() != corpus.Int32 || ok && c.Dtype() != d {
			t.Fatalf("%s: dtype %s", name, c.Dtype())
		}
		if c.Packed() != (name != "ref.arrow") {
			t.Fatalf("%s: packed %v", name, c.Packed())
		}
		same(t, name, readDocs(t, c), want)
		c.Close()
	}

	// A page whose bytes differ from its CRC is an error naming it: found
	// when the file is indexed, or when the page is read afterwards (a
	// store that returns other bytes than it was given); without the CRC,
	// an uncompressed page's flipped byte would be another token.
	crc := filepath.Join(dir, "crc.parquet")
	c, err := corpus.Open(ctx, corpus.Options{IndexDir: t.TempDir(), IndexInDirOnly: true}, crc)
	if err != nil {
		t.Fatal(err)
	}
	doc := c.Docs() / 2
	l := c.Locate(doc, 0, c.Len(doc))
	flip := l.Off + l.Len - 3 // a value of the group's last page
	c.Close()
	b, _ = os.ReadFile(crc)
	b[flip] ^= 0x10
	badDir := t.TempDir()
	bad := filepath.Join(badDir, "crc.parquet")
	os.WriteFile(bad, b, 0o644)
	var fe *corpus.FormatError
	_, err = corpus.Open(ctx, corpus.Options{IndexDir: t.TempDir(), IndexInDirOnly: true}, bad)
	if !errors.Is(err, corpus.ErrCorrupt) || !errors.As(err, &fe) || fe.Path != bad || fe.Offset < l.Off || fe.Offset >= l.Off+l.Len || !strings.Contains(err.Error(), "CRC") {
		t.Fatalf("a page unlike its CRC, when indexed: %v (want a page of %d..%d)", err, l.Off, l.Off+l.Len)
	}
	local, _ := storage.NewLocal(false, nil)
	flipper := &flipStore{Store: local}
	c, err = corpus.Open(ctx, corpus.Options{Store: flipper, IndexDir: t.TempDir(), IndexInDirOnly: true}, crc)
	if err != nil {
		t.Fatal(err)
	}
	flipper.at.Store(flip)
	err = c.Read(ctx, doc, 0, make([]int64, c.Len(doc)))
	if !errors.Is(err, corpus.ErrCorrupt) || !errors.As(err, &fe) || fe.Path != crc || fe.Offset < l.Off || fe.Offset >= l.Off+l.Len || !strings.Contains(err.Error(), "CRC") {
		t.Fatalf("a page unlike its CRC, when read: %v (want a page of %d..%d)", err, l.Off, l.Off+l.Len)
	}
	c.Close()

	env, err := job.NewEnv(job.EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	const S, B, steps = 64, 8, 3
	type arrays struct {
		ids, labels, pos []int64
		mask             []float32
	}
	// drain reads up to n batches of j (n < 0: to its end).
	drain := func(j *job.Job, n int, got map[int]arrays, seen map[int]int) {
		t.Helper()
		for ; n != 0; n-- {
			b, err := j.Next(ctx)
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			at := func(k int) unsafe.Pointer { return unsafe.Pointer(&b.Data[b.Arrays[k].Off]) }
			m := len(b.IDs) * S
			ids, lab := unsafe.Slice((*int64)(at(0)), m), unsafe.Slice((*int64)(at(1)), m)
			pos, mask := unsafe.Slice((*int64)(at(2)), m), unsafe.Slice((*float32)(at(3)), m)
			for i, id := range b.IDs {
				r := i * S
				got[id] = arrays{slices.Clone(ids[r : r+S]), slices.Clone(lab[r : r+S]), slices.Clone(pos[r : r+S]), slices.Clone(mask[r : r+S])}
				seen[id]++
			}
			b.Release()
		}
	}
	for _, packing := range []string{"concat", "best_fit", "pad"} {
		open := func(name string, rank, world, start int) *job.Job {
			t.Helper()
			spec := &wire.JobSpec{Paths: []string{filepath.Join(dir, name)}, SeqLen: S, Packing: packing, BatchSize: B, Shuffle: true, Seed: 7,
				Rank: rank, World: world, Start: start, Epochs: 1, VocabSize: w.Vocab}
			if packing == "best_fit" {
				spec.PackWindow = 64
			}
			j, err := env.Open(ctx, spec, nil)
			if err != nil {
				t.Fatalf("%s %s: %v", name, packing, err)
			}
			return j
		}
		want := map[int]arrays{}
		j := open("ref.arrow", 0, 1, 0)
		drain(j, -1, want, map[int]int{})
		j.Close()
		for name := range w.Files {
			if name == "ref.arrow" {
				continue
			}
			got, seen := map[int]arrays{}, map[int]int{}
			for rank := range 2 {
				j := open(name, rank, 2, 0)
				drain(j, steps, got, seen)
				j.Close()
			}
			for rank := range 2 {
				j := open(name, rank, 2, steps*2*B)
				drain(j, -1, got, seen)
				j.Close()
			}
			extra := 0
			for id, a := range want {
				g := got[id]
				if seen[id] == 0 {
					t.Fatalf("%s %s: sample %d never delivered", name, packing, id)
				}
				extra += seen[id] - 1
				if !slices.Equal(g.ids, a.ids) || !slices.Equal(g.labels, a.labels) || !slices.Equal(g.pos, a.pos) || !slices.Equal(g.mask, a.mask) {
					t.Fatalf("%s %s: sample %d differs from uncompressed Arrow's:\n%v\n%v", name, packing, id, g.ids, a.ids)
				}
			}
			if len(got) != len(want) || extra > 1 {
				t.Fatalf("%s %s: %d samples (%d twice), uncompressed Arrow's %d", name, packing, len(got), extra, len(want))
			}
		}
		t.Logf("%s: %d samples of each file equal uncompressed Arrow's", packing, len(want))
	}

	// In a mixture, packed sources beside each other and beside one of
	// byte ranges: the mixture's samples are those of the same documents
	// uncompressed.
	ref, _ := os.ReadFile(filepath.Join(dir, "ref.arrow"))
	os.WriteFile(filepath.Join(dir, "ref2.arrow"), ref, 0o644)
	mixed := func(a, b string) map[int]arrays {
		spec := &wire.JobSpec{Mixture: []wire.MixSource{{Paths: []string{filepath.Join(dir, a)}, Weight: 2}, {Paths: []string{filepath.Join(dir, b)}, Weight: 1}},
			SeqLen: S, BatchSize: B, Shuffle: true, Seed: 3, Epochs: 1, VocabSize: w.Vocab}
		j, err := env.Open(ctx, spec, nil)
		if err != nil {
			t.Fatalf("mixture of %s and %s: %v", a, b, err)
		}
		got := map[int]arrays{}
		drain(j, -1, got, map[int]int{})
		j.Close()
		return got
	}
	want := mixed("ref.arrow", "ref2.arrow")
	for _, m := range [][2]string{{"lz4.arrow", "snappy.parquet"}, {"ref.arrow", "u16.parquet"}, {"zstd_dict.parquet", "ref.arrow"}} {
		got := mixed(m[0], m[1])
		if len(got) != len(want) {
			t.Fatalf("mixture of %s: %d samples, uncompressed Arrow's %d", m, len(got), len(want))
		}
		for id, a := range want {
			if !slices.Equal(got[id].ids, a.ids) || !slices.Equal(got[id].labels, a.labels) {
				t.Fatalf("mixture of %s: sample %d differs from uncompressed Arrow's", m, id)
			}
		}
	}
}
