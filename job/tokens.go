package job

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/order"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/wire"
)

// A token corpus (issue 48; docs/tokens.md). A spec that gives seq_len
// names a corpus (package corpus: Megatron's .bin/.idx, flat token files,
// 1-D token .npy, a tokenized column of Arrow files or a Hugging Face
// directory) and its records are each epoch's samples (package sequence:
// which tokens form sample i of epoch e, concat, best_fit or pad). The
// corpus is kept among the Env's datasets as the dataset of its documents
// (corpus.Docs); the order shuffles an epoch's samples as it shuffles
// records (order.Source.Tokens), and the loader reads each sample's
// pieces and fills the batch's arrays (loader.Options.Samples).
//
// Without seq_len a path keeps the meaning it had: a 1-D .npy is records
// of one value, an Arrow file rows, a flat .bin fixed-size records of the
// size given. Only a Megatron corpus is refused (an .idx, a prefix, or a
// .bin with its .idx beside it): its .bin read as records of a size would
// cut documents at byte counts, silently, and its .idx is no dataset; the
// error says to give seq_len (or format "fixed" to read the bytes anyway).

// Tokens is a checked token corpus's options: how it opens, how its
// samples are cut, and the input id of padding.
type Tokens struct {
	Corpus   corpus.Options
	Sequence sequence.Options
	Pad      int64
}

// EOD is the end-of-document token, or -1 for none.
func (t *Tokens) EOD() int64 {
	if !t.Corpus.HasEOD {
		return -1
	}
	return t.Corpus.EOD
}

// tokenOption names a token option other than seq_len the spec sets, or
// "" if none.
func tokenOption(s *wire.JobSpec) string {
	for _, o := range []struct {
		name string
		set  bool
	}{{"packing", s.Packing != ""}, {"pad_last", s.PadLast}, {"eod", s.EOD != nil}, {"vocab_size", s.VocabSize != 0},
		{"pad_id", s.PadID != 0}, {"token_dtype", s.TokenDtype != ""}, {"token_column", s.TokenColumn != ""},
		{"pack_window", s.PackWindow != 0}} {
		if o.set {
			return o.name
		}
	}
	return ""
}

// corpusFormats are the formats a token corpus may name.
var corpusFormats = []string{"megatron", "flat", "npy", "arrow", "hf"}

// checkTokens checks a spec of a token corpus; c is the rest of its plan,
// checked.
func checkTokens(spec *wire.JobSpec, c Plan) (*Tokens, error) {
	if spec.SeqLen == 0 {
		return nil, specErr("%s without seq_len: the token options shape the samples of a token corpus, which seq_len makes the records; give seq_len", tokenOption(spec))
	}
	mode := sequence.Mode(spec.Packing)
	switch mode {
	case "":
		mode = sequence.Concat
	case sequence.Concat, sequence.BestFit, sequence.Pad:
	default:
		return nil, specErr("packing %q: want concat, best_fit or pad", spec.Packing)
	}
	switch {
	case spec.PadLast && mode != sequence.Concat:
		return nil, specErr("pad_last keeps concat's last partial sample: packing %s leaves none", mode)
	case spec.PackWindow != 0 && mode != sequence.BestFit:
		return nil, specErr("pack_window is best_fit's documents a window: packing %s has no windows", mode)
	case spec.VocabSize > 0 && spec.PadID >= spec.VocabSize:
		return nil, specErr("pad_id %d is outside vocab_size %d: padding's input id is looked up in the embedding too", spec.PadID, spec.VocabSize)
	case spec.VocabSize > 0 && spec.EOD != nil && *spec.EOD >= spec.VocabSize:
		return nil, specErr("eod %d is outside vocab_size %d", *spec.EOD, spec.VocabSize)
	case spec.Format != "" && !slices.Contains(corpusFormats, spec.Format):
		return nil, specErr("format %q with seq_len: a token corpus is one of %s", spec.Format, strings.Join(corpusFormats, ", "))
	case len(spec.TokenColumn) > maxName:
		return nil, specErr("token_column: a name of %d bytes, at most %d", len(spec.TokenColumn), maxName)
	}
	// What shapes records, selects them or orders them otherwise has no
	// meaning for samples: each is refused by name.
	for _, o := range []struct {
		name, why string
		set       bool
	}{
		{"record_size", "a corpus's tokens say their size", spec.RecordSize != 0},
		{"header_bytes", "a corpus's files say where their tokens start", spec.HeaderBytes != 0},
		{"csv_header", "a corpus has no CSV", spec.CSVHeader},
		{"skip_crc", "a corpus has no CRCs", spec.SkipCRC},
		{"drop_partial", "a corpus's files end on whole tokens, or are refused", spec.DropPartial},
		{"columns", "a corpus reads one column: token_column", len(spec.Columns) > 0},
		{"extensions", "a corpus is files, not a directory of records", len(spec.Extensions) > 0},
		{"subset", "the records are each epoch's samples, which no id names across epochs", spec.Subset != nil},
		{"filter", "the records are samples, which carry no label, size or file", spec.Filter != nil},
		{"dedup", "the records are samples, which no two epochs cut alike", spec.Dedup},
		{"refresh", "a corpus's samples are cut from its documents as opened", spec.Refresh != ""},
		{"transform", "a sample is arrays of tokens already", spec.Transform != ""},
		{"direct", "a sample's pieces are byte ranges of tokens, read through the page cache", spec.Direct != nil && *spec.Direct},
		{"block_size", "samples are shuffled globally (shuffle) or read in order", spec.BlockSize != 0},
		{"window", "a token corpus's block order is best_fit's (sampler block); best_fit's documents a window are pack_window", spec.Window != 0 && (mode != sequence.BestFit || c.Sampler.Kind != "block")},
		{"buffer", "samples are shuffled globally (shuffle) or read in order", spec.Buffer != 0},
		{"reservoir", "samples are shuffled globally (shuffle) or read in order", spec.Reservoir != 0},
		{"opportunistic", "a batch's samples are put together as they are planned", spec.Opportunistic > 1},
		{"min_randomness", "samples are shuffled globally (shuffle) or read in order", spec.MinRandomness != 0},
		{"auto_order", "samples are shuffled globally (shuffle) or read in order", spec.AutoOrder != nil},
		{"mixture_stop all_exhausted", "a source used up would go on into its own next epoch, whose samples are cut from another document order than the mixture's epoch's: a mixture of token corpora is first_exhausted", c.Mixture != nil && c.Mixture.Cycle},
		{"share", "a mixture of token corpora is not shared: each job reads its own", c.Share && c.Mixture != nil},
		{"delivered", "an order of a token corpus's samples that is not shared is a function of position: it resumes from start", len(spec.Delivered) > 0 && !c.Share},
	} {
		if o.set {
			return nil, specErr("%s with seq_len: %s", o.name, o.why)
		}
	}
	switch k := c.Sampler.Kind; {
	case k == "block" && (mode != sequence.BestFit || c.Mixture != nil):
		return nil, specErr("sampler block with seq_len is an order over best_fit's windows (each window packed once): packing %s has none, and a mixture's sources are each in their own order", mode)
	case k == "block" && spec.Window > maxTokenBlockWindow:
		return nil, specErr("window %d with sampler block of a token corpus: at most %d, the windows kept packed at once", spec.Window, maxTokenBlockWindow)
	case k != "" && k != "global" && k != "sequential" && k != "block":
		return nil, specErr("sampler %q with seq_len: a token corpus's samples are shuffled globally (global), read in order (sequential), or, of best_fit, in blocks of its windows (block)", k)
	}
	if mode == sequence.BestFit && spec.Epochs > 1 {
		// A sampler has one length, and best_fit packs each epoch's
		// documents into a number of samples of its own: a job of one
		// epoch has the one length exactly (the next epoch is a job of
		// its own, as a growing dataset's is). Epochs without end (-1)
		// read the one epoch, and opened says so (wire.Tokens.PerEpoch).
		return nil, specErr("packing best_fit with epochs %d: best_fit packs each epoch's document order into its own number of samples, so a job reads one epoch (epochs 1, or -1: the job ends with its epoch); open the next epoch as a job of its own", spec.Epochs)
	}
	if b := sequence.BatchBytes(max(1, spec.BatchSize), spec.SeqLen); b > maxTokenBatch {
		return nil, specErr("batch_size %d of seq_len %d: a batch of %d bytes, at most %d", spec.BatchSize, spec.SeqLen, b, int64(maxTokenBatch))
	}
	t := &Tokens{Pad: spec.PadID}
	t.Corpus = corpus.Options{Format: spec.Format, Vocab: spec.VocabSize, Column: spec.TokenColumn, Split: spec.Split}
	if spec.TokenDtype != "" {
		d, err := corpus.ParseDtype(spec.TokenDtype)
		if err != nil {
			return nil, specErr("token_dtype: %v", err)
		}
		t.Corpus.Dtype = d
	}
	if spec.EOD != nil {
		t.Corpus.EOD, t.Corpus.HasEOD = *spec.EOD, true
	}
	t.Sequence = sequence.Options{SeqLen: spec.SeqLen, Mode: mode, Seed: documentSeed(spec.Seed), PadLast: spec.PadLast,
		Window: spec.PackWindow, InOrder: c.Sampler.Kind == "sequential"}
	if mode == sequence.BestFit && t.Sequence.Window == 0 {
		t.Sequence.Window = sequence.DefaultWindow // one value for one window: share groups key by it
	}
	return t, nil
}

// maxTokenBlockWindow is the most best_fit windows a block order of a
// token corpus mixes: the windows package sequence keeps packed.
const maxTokenBlockWindow = sequence.KeptWindows

// documentSeed keys the epochs' document orders: the seed under another
// key than the samples' order's, so that pad's (one document a sample)
// is not the same permutation twice.
func documentSeed(seed uint64) uint64 { return sampler.Mix(seed, 0xd0c) }

// tokenSource opens the plan's token corpus, or its mixture's corpora one
// after another (their documents' datasets put together: the loader
// reads their objects as one list).
func (env *Env) tokenSource(ctx context.Context, plan Plan) (*source, error) {
	if plan.Mixture == nil {
		return env.corpusSource(ctx, plan.Paths, plan.Tokens.Corpus)
	}
	var parts []*source
	for k, paths := range plan.Mixture.Sources {
		p, err := env.corpusSource(ctx, paths, plan.Tokens.Corpus)
		if err != nil {
			for _, o := range parts {
				env.sets.put(o)
			}
			return nil, fmt.Errorf("mixture source %d: %w", k, err)
		}
		parts = append(parts, p)
	}
	return env.sets.concatOpen(ctx, "mixture", parts, dataset.Options{})
}

// corpusSource opens the token corpus of paths (expanded here, once, as a
// corpus names its files: a Megatron prefix is its .idx) among the Env's
// datasets, as the dataset of its documents.
func (env *Env) corpusSource(ctx context.Context, paths []string, opts corpus.Options) (*source, error) {
	opts.Store = env.store
	format, names, err := corpus.Expand(ctx, env.store, opts.Format, paths)
	if err != nil {
		return nil, err
	}
	opts.Format = format
	key := fmt.Sprintf("corpus %s %s %v %v %d %d %q %q", opts.Format, opts.Dtype, opts.HasEOD, opts.EOD, opts.Vocab, 0, opts.Column, opts.Split)
	return env.sets.getWith(ctx, names, key, func(ctx context.Context) (dataset.Dataset, error) {
		opts.IndexDir, opts.IndexInDirOnly = env.opts.IndexDir, env.opts.IndexInDirOnly
		c, err := corpus.Open(ctx, opts, names...)
		if err != nil {
			return nil, err
		}
		return c.Dataset(), nil
	})
}

// refuseCorpus says, of a plan without seq_len whose first path is a
// Megatron corpus, what to give instead; nil for any other path.
func (env *Env) refuseCorpus(ctx context.Context, plan Plan, paths []string) error {
	if plan.Dataset.Format != "" || plan.Dataset.RecordSize > 0 || len(paths) == 0 {
		return nil
	}
	if f, err := corpus.Detect(ctx, env.store, paths[0]); err != nil || f != "megatron" {
		return nil
	}
	return specErr("%s is a Megatron corpus (.bin/.idx): give seq_len (and packing) to read its samples of that many tokens; its .bin read as records of a size would cut documents at byte counts (give format \"fixed\" and record_size to read its bytes anyway)", paths[0])
}

// tokenSamples makes the job's samples of its corpus (or of each of its
// mixture's corpora, their documents' orders seeded apart), and the
// batches the loader plans of them.
func (j *Job) tokenSamples() error {
	t := j.plan.Tokens
	parts := []*source{j.src}
	if j.src.parts != nil {
		parts = j.src.parts
	}
	var srcs []sequence.Source
	objects := 0
	for k, p := range parts {
		docs := p.ds.(*corpus.Docs)
		c := docs.Corpus()
		if d := t.Corpus.Dtype; d != corpus.NoDtype && d != c.Dtype() {
			return specErr("token_dtype %s: %s holds %s tokens, as its files say", d, p.desc(), c.Dtype())
		}
		opts := t.Sequence
		if j.src.parts != nil {
			opts.Seed = sampler.Mix(opts.Seed, uint64(k)+1)
		}
		s, err := p.samplesOf(c, opts)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", errSpec, p.desc(), err)
		}
		if e := j.plan.Loader.Epoch; s.Len(e) == 0 {
			return fmt.Errorf("%w: %s: its %d tokens make no sample of seq_len %d (packing %s) in epoch %d", dataset.ErrEmpty, p.desc(), c.Tokens(), opts.SeqLen, opts.Mode, e)
		}
		srcs = append(srcs, sequence.Source{Corpus: c, Samples: s, Objects: objects})
		j.samples = append(j.samples, s)
		objects += docs.Objects()
	}
	var err error
	if j.tokens, err = sequence.NewBatcher(srcs, t.Pad, t.EOD()); err != nil {
		return fmt.Errorf("%w: %w", errSpec, err)
	}
	return nil
}

// stats are the padding, cut and dropped tokens of the job's first epoch,
// over its sources.
func (j *Job) stats() sequence.Stats {
	var st sequence.Stats
	for _, s := range j.samples {
		x := s.Stats(j.plan.Loader.Epoch)
		st.Samples += x.Samples
		st.SeqLen = x.SeqLen
		st.Docs += x.Docs
		st.Tokens += x.Tokens
		st.Padding += x.Padding
		st.Dropped += x.Dropped
		st.Cut += x.Cut
	}
	return st
}

// tokenSize sets a job of samples' memory bound as size does: a batch is
// its arrays (sequence.BatchBytes) and the pieces read for them, a
// sample's at most seq_len+1 tokens, staged before its arrays are filled.
func (j *Job) tokenSize() (Ask, error) {
	bs := j.plan.Loader.BatchSize
	S := j.tokens.SeqLen()
	size := int64(0)
	for _, s := range j.tokens.Sources() {
		size = max(size, int64(s.Corpus.Dtype().Size()))
	}
	batch := sequence.BatchBytes(bs, S) + mulSat(int64(bs), int64(S+1)*size) + 1<<12
	mem := j.plan.Memory
	if mem == 0 {
		mem = jobMemory(batch/int64(bs), bs, batch, j.env.opts.JobMemory)
	}
	if mem < batch {
		return Ask{}, specErr("memory_bytes %d is smaller than one batch (%d bytes for batch_size %d of seq_len %d): raise memory_bytes or lower batch_size",
			mem, batch, bs, S)
	}
	j.memory = mem
	j.arenaOf = func(m int64) int64 {
		batches := m/max(1, batch) + 16
		return mulSat(2, m) + mulSat(batches, metaBytes(bs)+64)
	}
	ask := Ask{Want: j.arenaOf(mem), Floor: j.arenaOf(mem)}
	if j.bends() {
		j.floor = min(mem, mulSat(2, batch))
		ask.Floor = j.arenaOf(j.floor)
	}
	return ask, nil
}

// tokenSource is the job's token corpus as its order takes it: the
// records are its samples, and its share group, if it shares, is the jobs
// whose samples are cut alike (tokenGroup).
func (j *Job) tokenSource() *order.Source {
	osrc := &order.Source{DS: j.src.ds, Tokens: j.tokens, Name: j.src.desc(), Group: j.tokenGroup()}
	if j.plan.Share {
		// A sample's pieces are no record of the cache: they wait in the
		// page cache, where the first job's read left them, bounded as a
		// group of raw records' pages are; a sample is at most its width
		// of tokens.
		size := 0
		for _, s := range j.tokens.Sources() {
			size = max(size, s.Samples.Width()*s.Corpus.Dtype().Size())
		}
		opts := share.Options{Hold: j.env.pageCacheBytes() / 2, Size: func(int) int { return size }}
		osrc.Share = [2]share.Options{opts, opts}
	}
	return osrc
}

// tokenGroup keys the share group of the jobs whose samples are cut
// alike: sample i of an epoch is the same pieces for all of them. That is
// the corpus (its files, their versions and how it opens) and every
// option that decides which tokens form a sample: seq_len, packing,
// pad_last, pack_window, the document order's seed and whether it
// shuffles; best_fit's samples are its epoch's, and so is its group (a
// job reads one epoch). What only fills a sample's arrays (pad_id) is
// not: jobs differing in it read the same pieces.
func (j *Job) tokenGroup() string {
	s := j.plan.Tokens.Sequence
	key := fmt.Sprintf("%s|tokens seq_len=%d packing=%s pad_last=%v window=%d seed=%d in_order=%v", j.src.key, s.SeqLen, s.Mode,
		s.PadLast, s.Window, s.Seed, s.InOrder)
	if s.Mode == sequence.BestFit {
		key += fmt.Sprintf(" epoch=%d", j.plan.Loader.Epoch)
	}
	return key
}

// TokensInfo describes a job of a token corpus's samples, for an opened
// reply: the corpus, how it is cut, and the arrays of a whole batch.
func (j *Job) tokensInfo() *wire.Tokens {
	if j.tokens == nil {
		return nil
	}
	t := j.plan.Tokens
	st := j.stats()
	out := &wire.Tokens{SeqLen: t.Sequence.SeqLen, Packing: string(t.Sequence.Mode), Documents: st.Docs, Tokens: st.Tokens,
		PadID: t.Pad, EOD: t.EOD(), Vocab: t.Corpus.Vocab,
		Padding: st.PaddingRate(), Cut: st.CutRate(), Dropped: st.DropRate(), PerEpoch: t.Sequence.Mode == sequence.BestFit}
	for k, s := range j.tokens.Sources() {
		if d := s.Corpus.Dtype().String(); k == 0 {
			out.Dtype = d
		} else if d != out.Dtype {
			out.Dtype = "mixed" // each source's own, decoded to int64 ids alike
		}
	}
	for _, a := range sequence.Layout(j.plan.Loader.BatchSize, t.Sequence.SeqLen, -1) {
		out.Arrays = append(out.Arrays, wire.Array{Name: a.Name, Dtype: a.Dtype, Shape: a.Shape, Off: int64(a.Off), Len: int64(a.Len)})
	}
	return out
}
