package corpus_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/sequence"
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
