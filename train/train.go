// Package train fits a small linear model, logistic regression by
// mini-batch SGD, through riffle's loader, to show what a shuffle's order
// does to convergence. It reproduces the experiment behind LIRS's Table 3
// and §5.2 (lirs.txt): on data sorted by label, a full or block-aware
// shuffle reaches a target loss in a few epochs, a small shuffle buffer
// needs many more, and no shuffle may never get there.
package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/libsvm"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// Config says how to train. The zero value works.
type Config struct {
	LR        float64 // learning rate; default 0.5
	L2        float64 // L2 penalty; default 1e-4
	BatchSize int     // default 32
	MaxEpochs int     // default 30
	Target    float64 // stop when the training loss is at most this; 0 runs MaxEpochs
}

func (c Config) withDefaults() Config {
	if c.LR == 0 {
		c.LR = 0.5
	}
	if c.L2 == 0 {
		c.L2 = 1e-4
	}
	if c.BatchSize == 0 {
		c.BatchSize = 32
	}
	if c.MaxEpochs == 0 {
		c.MaxEpochs = 30
	}
	return c
}

// Data is a LIBSVM dataset parsed once, to measure the loss.
type Data struct {
	Rows []libsvm.Row
	Dim  int
}

// Load parses every record of ds as a LIBSVM line. A malformed line is an
// error naming its file and offset.
func Load(ctx context.Context, ds dataset.Dataset) (*Data, error) {
	l, err := loader.New(ctx, ds, sampler.Sequential{N: ds.Len()}, loader.Options{Ordered: true})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	d := &Data{Rows: make([]libsvm.Row, ds.Len())}
	for {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) {
			return d, nil
		}
		if err != nil {
			return nil, err
		}
		for i, id := range b.IDs {
			r := &d.Rows[id]
			if err := libsvm.Parse(b.Record(i), r); err != nil {
				b.Release()
				return nil, recordError(ds, id, err)
			}
			r.Index, r.Value = append([]int32(nil), r.Index...), append([]float32(nil), r.Value...)
			for _, k := range r.Index {
				d.Dim = max(d.Dim, int(k)+1)
			}
		}
		b.Release()
	}
}

func recordError(ds dataset.Dataset, id int, err error) error {
	loc := ds.Locate(id)
	return &dataset.FormatError{Path: ds.Object(loc.Object).Name(), Offset: loc.Off, Err: fmt.Errorf("record %d: %w", id, err)}
}

// Model is logistic regression: P(y=1|x) = sigmoid(w.x + b).
type Model struct {
	W []float64
	B float64
}

func sigmoid(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

func (m *Model) score(r *libsvm.Row) float64 {
	z := m.B
	for k, i := range r.Index {
		z += m.W[i] * float64(r.Value[k])
	}
	return z
}

func target(r *libsvm.Row) float64 {
	if r.Label > 0 {
		return 1
	}
	return 0
}

// Accuracy is the share of d's examples whose label the model's sign gets.
func (m *Model) Accuracy(d *Data) float64 {
	right := 0
	for i := range d.Rows {
		r := &d.Rows[i]
		if (m.score(r) > 0) == (target(r) == 1) {
			right++
		}
	}
	return float64(right) / float64(max(1, len(d.Rows)))
}

// Loss is the mean logistic loss over d plus the L2 penalty.
func (m *Model) Loss(d *Data, l2 float64) float64 {
	var s float64
	for i := range d.Rows {
		r := &d.Rows[i]
		z := m.score(r)
		y := target(r)
		// log(1+e^z) - y z, computed without overflow
		s += math.Max(z, 0) + math.Log1p(math.Exp(-math.Abs(z))) - y*z
	}
	var w2 float64
	for _, w := range m.W {
		w2 += w * w
	}
	return s/float64(len(d.Rows)) + l2/2*w2
}

// Result is one training run.
type Result struct {
	Epochs  int       // epochs to reach the target; 0 if never
	Seconds float64   // wall time of training (not of measuring the loss) to the target or the end
	Losses  []float64 // training loss after each epoch
	// Accuracy is the share of examples the final model classifies right.
	Accuracy float64
}

// Run trains a fresh model on ds in the order of s, measuring the loss on d
// after each epoch, until the target or MaxEpochs.
func Run(ctx context.Context, ds dataset.Dataset, d *Data, s sampler.Sampler, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	m := &Model{W: make([]float64, d.Dim)}
	grad := make([]float64, d.Dim)
	var row libsvm.Row
	var res Result
	var spent time.Duration
	for e := range cfg.MaxEpochs {
		start := time.Now()
		l, err := loader.New(ctx, ds, s, loader.Options{BatchSize: cfg.BatchSize, Epoch: e, Depth: 16})
		if err != nil {
			return res, err
		}
		for {
			b, err := l.Next(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				l.Close()
				return res, err
			}
			clear(grad)
			var gb float64
			for i, id := range b.IDs {
				if err := libsvm.Parse(b.Record(i), &row); err != nil {
					b.Release()
					l.Close()
					return res, recordError(ds, id, err)
				}
				g := sigmoid(m.score(&row)) - target(&row)
				for k, j := range row.Index {
					if int(j) < len(grad) {
						grad[j] += g * float64(row.Value[k])
					}
				}
				gb += g
			}
			n := float64(len(b.IDs))
			for j := range m.W {
				m.W[j] -= cfg.LR * (grad[j]/n + cfg.L2*m.W[j])
			}
			m.B -= cfg.LR * gb / n
			b.Release()
		}
		l.Close()
		spent += time.Since(start)
		loss := m.Loss(d, cfg.L2)
		res.Losses = append(res.Losses, loss)
		res.Seconds = spent.Seconds()
		res.Accuracy = m.Accuracy(d)
		if cfg.Target > 0 && loss <= cfg.Target {
			res.Epochs = e + 1
			return res, nil
		}
	}
	return res, nil
}
